"""`make cpu-data` leaves the system alone (issue 56, item 6): it takes the pinned python3.11-doc .deb, checks its
SHA-256 and unpacks it into the checkout's cache, as a non-root user, with no package installed or upgraded.

The real run (marker slow, tier REST) downloads from Debian as user nobody in a copy of the Makefile owned by nobody
and checks the corpus built from the unpacked tree against study C's pinned MD5 (workflow/rules/local.smk). The
offline tests build a tiny .deb of their own and pin it on make's command line: a bad download, a bad cached .deb and
a broken archive each end as they should, and a done tree is not unpacked again."""

import hashlib
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gradfidelity.studies.local.rules import EXPORT_MD5

REPO = Path(__file__).resolve().parents[1]
MAKEFILE = REPO / "Makefile"


def _make_var(name: str) -> str:
    found = re.search(rf"^{name} :?= (\S+)$", MAKEFILE.read_text(), re.M)
    assert found, f"{name} not in the Makefile"
    return found.group(1)


VERSION = _make_var("PYDOCS_VERSION")
DEB = f"python3.11-doc_{VERSION}_all.deb"
SOURCES = Path(".cache/python3.11-doc", VERSION, "usr/share/doc/python3.11/html/_sources")
STAMP = Path(".cache/python3.11-doc", VERSION, ".complete")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _make(cwd: Path, *args: str, prefix: tuple[str, ...] = (), home: Path | None = None):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home or cwd), "LANG": "C.UTF-8"}
    return subprocess.run([*prefix, "make", "--no-print-directory", "cpu-data", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _non_root() -> tuple[tuple[str, ...], int]:
    """The command prefix that runs make as a non-root user, and that user's uid."""
    if os.geteuid() != 0:
        return (), os.geteuid()
    nobody = pwd.getpwnam("nobody")
    if shutil.which("setpriv"):
        return ("setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"), nobody.pw_uid
    if shutil.which("runuser"):
        return ("runuser", "-u", "nobody", "--"), nobody.pw_uid
    pytest.skip("running as root with neither setpriv nor runuser: no way to run make as a non-root user")


def _system_state(uid: int, skip: Path) -> dict:
    """What a set-up step could change outside the checkout: the dpkg database (an install or upgrade rewrites its
    status file), the pinned package's version, and the files the user owns in the world-writable folders."""
    state = {}
    status = Path("/var/lib/dpkg/status")
    if status.is_file():
        state["dpkg status"] = _sha256(status)
    if shutil.which("dpkg-query"):
        state["python3.11-doc"] = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "python3.11-doc"],
                                                 capture_output=True, text=True).stdout
    found = subprocess.run(["find", "/tmp", "/var/tmp", "/dev/shm", "-xdev", "-user", str(uid)],
                           capture_output=True, text=True).stdout.split("\n")
    state["user's files in /tmp, /var/tmp, /dev/shm"] = sorted(p for p in found if p and not p.startswith(str(skip)))
    return state


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for here, dirs, files in os.walk(root):
        for name in [here, *(os.path.join(here, n) for n in dirs + files)]:
            os.chown(name, uid, gid)


@pytest.mark.slow
def test_cpu_data_as_non_root_user_leaves_the_system_alone():
    prefix, uid = _non_root()
    gid = pwd.getpwuid(uid).pw_gid
    corpus_md5 = EXPORT_MD5["python_docs"]  # the pin the corpus rule checks
    pinned_sha = _make_var("PYDOCS_SHA256")
    checkout_deb = REPO / ".cache/python3.11-doc" / DEB
    root = Path(tempfile.mkdtemp(prefix="cpu-data-nonroot-"))
    try:
        copy, home = root / "checkout", root / "home"
        home.mkdir()
        copy.mkdir()
        shutil.copy2(MAKEFILE, copy / "Makefile")
        # One download per machine: the checkout's cached .deb stands in for it when it is the pinned file.
        reused = checkout_deb.is_file() and _sha256(checkout_deb) == pinned_sha
        if reused:
            (copy / ".cache/python3.11-doc").mkdir(parents=True)
            shutil.copy2(checkout_deb, copy / ".cache/python3.11-doc" / DEB)
        _chown_tree(root, uid, gid)
        before = _system_state(uid, root)

        res = _make(copy, prefix=prefix, home=home)

        assert res.returncode == 0, res.stdout + res.stderr
        assert _system_state(uid, root) == before
        assert list(home.iterdir()) == [], "make cpu-data wrote into HOME"
        deb = copy / ".cache/python3.11-doc" / DEB
        assert _sha256(deb) == pinned_sha
        assert (copy / STAMP).is_file() and not list(deb.parent.glob(".unpack.*")) and not list(
            deb.parent.glob("*.part.*"))
        assert {p.lstat().st_uid for p in copy.rglob("*")} == {uid}  # every file it wrote is the user's
        # The corpus study C trains on, built by the project's own tool from the unpacked tree, is the pinned one.
        out = root / "pydocs.txt"
        built = subprocess.run([sys.executable, "-m", "gradfidelity", "local-corpus", "--root", str(copy / SOURCES),
                                "--suffix", ".rst.txt", "--md5", corpus_md5, "--out", str(out)],
                               capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stdout + built.stderr
        assert hashlib.md5(out.read_bytes()).hexdigest() == corpus_md5
        if not reused:  # keep the verified download for the checkout's own make cpu-data and the next run
            checkout_deb.parent.mkdir(parents=True, exist_ok=True)
            part = checkout_deb.with_name(f"{DEB}.part.test")
            shutil.copy2(deb, part)
            os.replace(part, checkout_deb)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- offline: a tiny .deb of our own, pinned on make's command line ---------------------------------------------


@pytest.fixture
def tiny_deb(tmp_path):
    """A .deb holding one python3.11-doc source file, and its SHA-256."""
    if not shutil.which("dpkg-deb"):
        pytest.skip("dpkg-deb is missing: cannot build the test's .deb")
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN/control").write_text("Package: python3.11-doc\nVersion: 0\nArchitecture: all\n"
                                        "Maintainer: test <t@example.org>\nDescription: test\n")
    src = pkg / "usr/share/doc/python3.11/html/_sources/a.rst.txt"
    src.parent.mkdir(parents=True)
    src.write_text("Title\n=====\n")
    deb = tmp_path / "tiny.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(pkg), str(deb)], check=True, capture_output=True)
    return deb, _sha256(deb)


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    copy.mkdir()
    shutil.copy2(MAKEFILE, copy / "Makefile")
    return copy


def test_cpu_data_unpacks_the_pinned_deb_once(tmp_path, tiny_deb):
    deb, sha = tiny_deb
    copy = _copy(tmp_path)
    cached = copy / ".cache/python3.11-doc" / DEB
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"an older download")  # not the pin: replaced, never unpacked
    pin = (f"PYDOCS_SHA256={sha}", f"PYDOCS_URLS=file://{tmp_path}/missing.deb file://{deb}")

    res = _make(copy, *pin)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "is not the pinned .deb" in res.stderr and f"could not download file://{tmp_path}/missing.deb" in res.stderr
    assert _sha256(cached) == sha
    assert (copy / SOURCES / "a.rst.txt").read_text() == "Title\n=====\n"
    stamp_time = (copy / STAMP).stat().st_mtime_ns

    again = _make(copy, *pin)
    assert again.returncode == 0 and "downloading" not in again.stdout
    assert (copy / STAMP).stat().st_mtime_ns == stamp_time


def test_cpu_data_refuses_a_download_that_is_not_the_pin(tmp_path, tiny_deb):
    deb, _ = tiny_deb
    copy = _copy(tmp_path)
    pinned = _make_var("PYDOCS_SHA256")

    res = _make(copy, f"PYDOCS_URLS=file://{deb}")

    assert res.returncode != 0
    assert f"file://{deb} gave SHA-256 {_sha256(deb)}, not the pinned {pinned}" in res.stderr
    assert f"no URL gave {DEB} with SHA-256 {pinned}" in res.stderr
    cache = copy / ".cache/python3.11-doc"
    assert sorted(p.name for p in cache.iterdir()) == []  # no .deb, no part file, no tree


def test_cpu_data_leaves_no_tree_when_unpacking_fails(tmp_path):
    copy = _copy(tmp_path)
    broken = tmp_path / "broken.deb"
    broken.write_bytes(b"!<arch>\nnot a debian archive\n")

    res = _make(copy, f"PYDOCS_SHA256={_sha256(broken)}", f"PYDOCS_URLS=file://{broken}")

    assert res.returncode != 0
    cache = copy / ".cache/python3.11-doc"
    assert sorted(p.name for p in cache.iterdir()) == [DEB]  # the download stays; no tree, no half-unpacked folder
