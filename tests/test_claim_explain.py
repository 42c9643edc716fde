"""`gradfidelity claim ID`: the explanation of one claim from a hand-made evidence file (every item it must show),
a failed gate, parts, missing evidence, unknown ids, and the one-line-per-claim list."""

import json

import pytest

from gradfidelity.claims import evidence as ev
from gradfidelity.claims.explain import explain_claim, list_claims
from gradfidelity.claims.verify import NOT_MEASURED, REPRODUCED, load_registry
from gradfidelity.errors import UserError

RUNS = [f"results/cpu/local/enwik8/w128/{arm}/seed{i}" for arm in ("bp", "rgc_async") for i in range(8)]
TABLE = "paper_tables/cpu/local_main.csv"


def _write(root, study, scale, values):
    path = root / "results" / scale / "claims" / f"{study}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"study": study, "scale": scale, "values": values}))
    return path


def _local_evidence():
    c1 = ev.paired_ratio([1.40, 1.38, 1.37, 1.39, 1.41], [1.0, 1.0, 1.01, 0.99, 1.0], ev.level_for("C1"),
                         detail="per-seed ratios ...", sources=[*RUNS, TABLE],
                         gates=[ev.gate("bp_learned", True, "BP 1.2 bpb vs unigram 4.9")])
    c3 = ev.paired_ratio([2.2, 2.1, 2.3], [1.0, 1.0, 1.0], ev.level_for("C3"), sources=RUNS[:2],
                         gates=[ev.gate("memory_probe", False, "PSS sampler saw no child processes")])
    c4 = ev.exact(2.095, n=5, detail="one-sided upper bound", sources=[TABLE])
    return {"C1": c1, "C3": c3, "C4": c4}


@pytest.fixture
def root(tmp_path):
    _write(tmp_path, "local", "cpu", _local_evidence())
    return tmp_path


def test_explain_shows_every_item(root):
    text = explain_claim("C1", "cpu", root)
    claim = next(r for r in load_registry() if r["id"] == "C1")
    rec = _local_evidence()["C1"]
    for item in (claim["statement"], claim["paper"], claim["paper_value"], claim["metric"], claim["why"],
                 "> 1", "min_n: 3", "95%", "n = 5"):
        assert item in text, item
    assert f"{rec['estimate']:.4g} [{rec['low']:.4g}, {rec['high']:.4g}] 95%" in text
    assert "bp_learned: passed (BP 1.2 bpb vs unigram 4.9)" in text and "all 1 passed" in text
    assert f"verdict: {REPRODUCED}" in text and "reason: the whole interval satisfies the check" in text
    assert f"evidence function: {rec['computed_by']}" in text and "test_claim_explain" in rec["computed_by"]
    # 16 run dirs: 12 shown one per line, the rest counted; the table listed too
    assert "run directories (16):" in text
    assert all(f"    {r}\n" in text for r in RUNS[:12]) and RUNS[12] not in text
    assert "... and 4 more" in text
    assert f"    {TABLE}\n" in text
    assert "evidence file: results/cpu/claims/local.json" in text
    last = text.rstrip().splitlines()[-1].strip()
    assert last == ".venv/bin/snakemake -c2 results/cpu/claims/local.json --config scale=cpu"


def test_exact_value_is_shown_as_exact(root):
    text = explain_claim("C4", "cpu", root)
    assert "estimate: 2.095 (exact), n = 5" in text
    assert f"verdict: {REPRODUCED}" in text and "gates: none" in text


def test_failed_gate_shows_the_gate_and_not_measured(root):
    text = explain_claim("C3", "cpu", root)
    assert "memory_probe: FAILED (PSS sampler saw no child processes)" in text
    assert "not measured" in text
    assert f"verdict: {NOT_MEASURED}" in text
    assert "reason: gate failed: memory_probe: PSS sampler saw no child processes" in text


def test_claim_missing_from_an_existing_file(root):
    text = explain_claim("C2", "cpu", root)
    assert "no record for C2" in text and f"verdict: {NOT_MEASURED}" in text
    assert "reported no value for C2" in text


def test_missing_evidence_still_shows_the_registry_and_the_command(tmp_path):
    text = explain_claim("B2", "smoke", tmp_path)
    claim = next(r for r in load_registry() if r["id"] == "B2")
    assert claim["statement"] in text and claim["metric"] in text and claim["why"] in text
    assert "no evidence yet at scale smoke" in text
    assert text.rstrip().endswith(".venv/bin/snakemake -c2 results/smoke/claims/async_pp.json --config scale=smoke")


def test_parts_are_shown_one_by_one(tmp_path):
    lvl = ev.level_for("A9")
    parts = {"accuracy": ev.mean_ci([1.0, 2.0, 1.5], lvl, sources=["results/cpu/sft_rl/a/seed0"]),
             "flops": ev.exact(0.4, n=3, sources=["results/cpu/sft_rl/b/seed0"])}
    _write(tmp_path, "sft_rl", "cpu", {"A9": ev.with_parts(parts, sources=["paper_tables/cpu/sft_rl_main.csv"])})
    text = explain_claim("A9", "cpu", tmp_path)
    acc = parts["accuracy"]
    assert f"accuracy (> 0): 1.5 [{acc['low']:.4g}, {acc['high']:.4g}] 95%, n = 3 -> {REPRODUCED}" in text
    assert f"flops (< 1): 0.4 (exact), n = 3 -> {REPRODUCED}" in text
    assert f"verdict: {REPRODUCED}" in text
    assert "results/cpu/sft_rl/a/seed0" in text and "results/cpu/sft_rl/b/seed0" in text
    assert "paper_tables/cpu/sft_rl_main.csv" in text


def test_unknown_id_lists_the_valid_ids(root):
    with pytest.raises(UserError) as err:
        explain_claim("Z9", "cpu", root)
    msg = str(err.value)
    assert "Z9" in msg and all(r["id"] in msg for r in load_registry())


def test_unknown_scale(root):
    with pytest.raises(UserError, match="scale"):
        explain_claim("C1", "huge", root)


def test_evidence_from_another_scale_is_refused(tmp_path):
    path = _write(tmp_path, "local", "cpu", _local_evidence())
    path.write_text(path.read_text().replace('"scale": "cpu"', '"scale": "smoke"'))
    with pytest.raises(UserError, match="scale"):
        explain_claim("C1", "cpu", tmp_path)


def test_list_claims_one_line_per_claim(root):
    text = list_claims("cpu", root)
    lines = text.rstrip().splitlines()[1:]
    registry = load_registry()
    assert len(lines) == len(registry)
    by_id = {line.split()[0]: line for line in lines}
    assert set(by_id) == {r["id"] for r in registry}
    assert REPRODUCED in by_id["C1"] and NOT_MEASURED in by_id["C3"]
    assert NOT_MEASURED in by_id["C2"]  # the file exists but has no record
    assert "no evidence yet" in by_id["A1"] and "ds_audit" in by_id["A1"]
    assert "Async RGC trains faster" in by_id["C1"]
