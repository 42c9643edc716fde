"""The README cannot drift: its generated table equals what `make docs` writes, and every snakemake command it shows
runs as written (as a dry run) and plans exactly the jobs it says; no absolute path of the checkout in any command."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gradfidelity.checkout_env import CACHES
from gradfidelity.docs import BEGIN, END, render

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _commands(prefix: str) -> list[str]:
    """Every `...` span and every code-block line of the README that starts with `prefix`."""
    spans = re.findall(r"`([^`\n]+)`", README)
    blocks = [line.lstrip("$ ").strip() for block in re.findall(r"```(?:bash)?\n(.*?)```", README, re.S)
              for line in block.splitlines()]
    cmds = [c.split("  #")[0].strip() for c in spans + blocks if c.startswith(prefix)]
    return sorted(set(cmds))


def _dry(cmd: str) -> subprocess.CompletedProcess:
    argv = shlex.split(cmd)
    argv = [sys.executable, "-m", "snakemake", "-n", *argv[1:]]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)


def _job_counts(stdout: str) -> dict[str, int]:
    table = stdout.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\S+)\s+(\d+)$", table, re.M)}


@pytest.mark.slow  # renders the table from a Snakemake dry run per target and scale: about 35 s
def test_generated_table_is_up_to_date():
    assert BEGIN in README and END in README
    assert render(README, REPO) == README, "README's claims-to-targets table is stale: run `make docs`"


def test_editing_a_statement_changes_the_generated_table(monkeypatch):
    import gradfidelity.docs as docs

    rows = docs.load_registry()
    monkeypatch.setattr(docs, "load_registry", lambda: [dict(r, statement=r["statement"] + " (edited)") for r in rows])
    monkeypatch.setattr(docs, "dry_run", lambda target, scale, cwd: docs.Plan(1, 1, ()))
    assert render(README, REPO) != README


SNAKEMAKE_COMMANDS = [c for c in _commands(".venv/bin/snakemake") if "--report" not in c and "--unlock" not in c
                      and "--list-rules" not in c]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", SNAKEMAKE_COMMANDS)
def test_readme_snakemake_command_plans(cmd):
    res = _dry(cmd if "--forceall" in cmd or "scale=bogus" in cmd or "bogus_key" in cmd else cmd + " --forceall")
    if "bogus" in cmd:  # the README shows these failing, with the message it quotes
        assert res.returncode != 0
        quoted = [line for line in README.splitlines() if line.startswith("bad config key") and
                  ("'bogus_key'" in line) == ("bogus_key" in cmd)]
        assert quoted and quoted[0] in res.stdout + res.stderr
        return
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
def test_home_stays_empty_through_the_readme_commands(tmp_path):
    """The README's commands as written (`.venv/bin/snakemake ...`, `.venv/bin/gradfidelity ...`), run with HOME at an
    empty folder and without the cache variables the Makefile exports: the venv keeps every cache in the checkout.
    (Before, Snakemake's source cache went to ~/.cache/snakemake.) The smoke DAG test runs real jobs the same way."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (*CACHES, "HF_HUB_OFFLINE")}
    env["HOME"] = str(home)
    venv = REPO / ".venv" / "bin"
    if not (venv / "snakemake").exists():
        pytest.skip("no .venv in this checkout (make setup creates it)")
    commands = [c for c in SNAKEMAKE_COMMANDS if "bogus" not in c] + _commands(".venv/bin/gradfidelity claim")
    assert len(commands) >= 5
    for cmd in commands:
        argv = shlex.split(cmd)
        argv = [str(REPO / argv[0]), *(["-n"] if argv[0].endswith("snakemake") else []), *argv[1:]]
        res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, cmd + res.stderr[-2000:]
        assert not list(home.rglob("*")), f"{cmd} wrote {list(home.rglob('*'))[:5]}"


@pytest.mark.slow
def test_table_job_counts_are_what_snakemake_plans():
    block = README.split(BEGIN, 1)[1].split(END, 1)[0].split("Every claim:", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 5
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        cmd = re.search(r"`(.+?)`", cells[2]).group(1)
        smoke_jobs = int(cells[4].split()[0])
        res = _dry(cmd + " --forceall")
        assert res.returncode == 0, res.stderr[-2000:]
        assert _job_counts(res.stdout)["total"] == smoke_jobs, cmd


@pytest.mark.slow
def test_one_rule_rerun_plans_only_that_rule():
    cmd = next(c for c in SNAKEMAKE_COMMANDS if "--forcerun" in c)
    res = _dry(cmd)
    assert res.returncode == 0, res.stderr[-2000:]
    assert set(_job_counts(res.stdout)) == {"stats_check", "total"}


def test_shell_commands_hold_no_absolute_path_of_the_checkout():
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "--config", "scale=smoke"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    shells = [line for line in res.stdout.splitlines() if line.startswith("Shell command:")]
    assert shells and not [s for s in shells if str(REPO) in s]


@pytest.mark.slow
def test_readme_gradfidelity_commands_run(tmp_path):
    cmds = _commands(".venv/bin/gradfidelity claim")
    assert cmds
    for cmd in cmds:
        argv = [sys.executable, "-m", "gradfidelity", *shlex.split(cmd)[1:]]
        res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, cmd + res.stderr[-2000:]


@pytest.mark.slow
def test_printed_rebuild_command_rebuilds_only_that_evidence():
    """`gradfidelity claim C4` prints a command; run as printed (dry run), it plans the local study's jobs only."""
    out = subprocess.run([sys.executable, "-m", "gradfidelity", "claim", "C4", "--scale", "smoke"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cmd = out.stdout.strip().splitlines()[-1].strip()
    assert cmd.startswith(".venv/bin/snakemake ") and "results/smoke/claims/local.json" in cmd
    res = _dry(cmd + " --forceall")
    assert res.returncode == 0, res.stderr[-2000:]
    rules = set(_job_counts(res.stdout)) - {"total"}
    assert rules and all(r.startswith("local") for r in rules), rules
