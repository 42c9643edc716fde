"""The CPU identity in provenance: what /proc/cpuinfo and torch say, and the host type that decides whether two runs
are compared bit for bit (two hosts that both read 'AMD EPYC' but dispatch to different ISA levels are not one)."""

import pytest

from gradfidelity.harness import provenance
from gradfidelity.harness.provenance import (
    UNKNOWN_ISA,
    cpu_identity,
    describe_host,
    host_type,
    isa_flags,
    same_host_type,
)

CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
stepping\t: 1
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""


@pytest.fixture(autouse=True)
def no_isa_limits(monkeypatch):
    for key in provenance.ISA_LIMITS:
        monkeypatch.delenv(key, raising=False)


def test_identity_from_cpuinfo_and_torch():
    ident = cpu_identity(CPUINFO, capability="AVX512")
    assert ident == {"cpu_vendor": "AuthenticAMD", "cpu_family": "25", "cpu_model_number": "17", "cpu_stepping": "1",
                     "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f avx512_bf16", "cpu_isa_limits": "none"}
    assert describe_host(ident) == "AuthenticAMD 25/17/1, torch AVX512, flags avx2 avx512f avx512_bf16"


def test_the_capability_is_torchs_own_and_limits_are_recorded(monkeypatch):
    import torch

    assert cpu_identity(CPUINFO)["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")  # invisible in torch's capability, yet other kernels
    assert cpu_identity(CPUINFO, "AVX512")["cpu_isa_limits"] == "MKL_ENABLE_INSTRUCTIONS=AVX2"


def test_isa_flags_keep_only_the_flags_that_pick_kernels():
    assert isa_flags("fpu sse2 avx avx2") == "avx2"
    assert isa_flags("avx2 amx_tile amx_bf16 avx512f") == "avx2 avx512f amx"
    assert isa_flags("fpu neon") == "none"  # never '', which a CSV reads back as missing


def test_two_records_that_differ_only_in_isa_are_not_one_host_type():
    avx512 = cpu_identity(CPUINFO, "AVX512")
    assert same_host_type(avx512, dict(avx512))
    assert not same_host_type(avx512, {**avx512, "cpu_capability": "AVX2"})
    assert not same_host_type(avx512, {**avx512, "cpu_flags": "avx2"})
    assert not same_host_type(avx512, {**avx512, "cpu_isa_limits": "ATEN_CPU_CAPABILITY=avx2"})
    assert not same_host_type(avx512, {**avx512, "cpu_model_number": "1"})


def test_a_record_without_identity_is_unknown_isa_and_never_the_same_host():
    old = {"cpu_model": "AMD EPYC"}
    assert host_type(old) is None and describe_host(old) == UNKNOWN_ISA
    assert not same_host_type(old, old)  # two unknowns are not known to match
    marked = {key: UNKNOWN_ISA for key in provenance.IDENTITY_KEYS}
    assert not same_host_type(marked, marked)
    assert host_type({**cpu_identity("", "DEFAULT")}) is None  # no /proc/cpuinfo: unknown, not a match


def test_a_csv_round_trip_keeps_the_host_type():
    ident = cpu_identity(CPUINFO, "AVX512")
    as_read = {**ident, "cpu_family": 25.0, "cpu_model_number": 17, "cpu_stepping": 1}  # pandas' types
    assert same_host_type(ident, as_read)


def test_provenance_machine_records_the_identity():
    machine = provenance.machine()
    assert set(provenance.IDENTITY_KEYS) <= set(machine) and machine["cpu_model"]
