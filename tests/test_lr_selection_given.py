"""Config `lr_selection_from`: an LR-tuned cell reads a given LR selection, so Snakemake plans the cell alone, not
the LR grid and selection behind it (what check-reference relies on to stay within minutes)."""

import pytest

from gradfidelity.reference.check import given_config
from tests._snakemake import REPO
from tests._snakemake import smk as _smk

# one tuned cell of each LR-tuned study at the cpu scale (both in the committed runs tables)
ASYNC_PP_CELL = ("results/cpu/async_pp/optimizer~adamw/lr~tuned/head~untied/schedule~sync/mitigation~none/depth~1/"
                 "momentum~0.95/steps~32/seed0/metrics.json")
SFT_RL_CELL = "results/cpu/sft_rl/tiny-qwen2/fixed/relift/seed0/metrics.json"
SELECTION_RULES = {"async_pp_select_lr", "async_pp_lr_round", "sft_rl_select_lr", "sft_rl_lr_round", "sft_rl_grid"}


def _planned_rules(*config: str) -> tuple[set[str], int]:
    res = _smk("-n", "--forceall", ASYNC_PP_CELL, SFT_RL_CELL, "--config", "scale=cpu", *config)
    assert res.returncode == 0, res.stderr[-3000:]
    rules = {line.split()[1].rstrip(":") for line in res.stdout.splitlines()
             if line.startswith(("rule ", "localrule "))}
    return rules, res.stdout.count("rule async_pp_train:")


def _given(tmp_path):
    """A folder of given selections: study A's committed one, and for study B (whose round-6 selection is not run
    yet: round 5's is archived) the archived document with the choices the cell's arm reads."""
    import shutil

    for study, src in (("sft_rl", REPO / "results/cpu/sft_rl/lr_selection.json"),
                       ("async_pp", REPO / "results/cpu/archive/async_pp_round5/lr_selection.json")):
        (tmp_path / study).mkdir()
        shutil.copy(src, tmp_path / study / "lr_selection.json")
    return tmp_path


@pytest.mark.slow
def test_given_selection_keeps_the_grid_out_of_the_plan(tmp_path):
    rules, trains = _planned_rules()
    assert {"async_pp_select_lr", "sft_rl_select_lr"} <= rules  # the grid behind a tuned cell, by default
    assert trains > 1
    rules, trains = _planned_rules(f"lr_selection_from={_given(tmp_path)}")
    assert not rules & SELECTION_RULES, rules
    assert trains == 1  # the cell itself
    assert "sft_rl_rl" in rules


@pytest.mark.slow  # a Snakemake dry run
def test_missing_given_selection_fails_naming_the_key(tmp_path):
    res = _smk("-n", ASYNC_PP_CELL, "--config", "scale=cpu", f"lr_selection_from={tmp_path}")
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "lr_selection_from" in out and str(tmp_path / "sft_rl" / "lr_selection.json") in out
    assert "Job stats" not in out


def test_rl_inputs_read_the_given_selection(monkeypatch):
    from types import SimpleNamespace

    import gradfidelity.studies.sft_rl.rules as sft_rl_rules

    monkeypatch.setattr(sft_rl_rules, "rl_init",
                        lambda cfg, root, committed=None: (lambda wildcards: "init/metrics.json"))
    cfg = SimpleNamespace(lr_selection=SimpleNamespace(enabled=True))
    given = sft_rl_rules.rl_inputs(cfg, "results/cpu/sft_rl", "/elsewhere/sft_rl/lr_selection.json")
    default = sft_rl_rules.rl_inputs(cfg, "results/cpu/sft_rl")
    assert given(None) == {"init": "init/metrics.json", "selection": "/elsewhere/sft_rl/lr_selection.json"}
    assert default(None)["selection"] == "results/cpu/sft_rl/lr_selection.json"


def test_check_reference_reads_the_committed_selections():
    config = dict(item.split("=", 1) for item in given_config(REPO))
    given = config["lr_selection_from"]
    assert given == str(REPO / "results" / "cpu")
    # committed with the studies' cpu runs (.gitignore keeps them): study A's round-6 selection; study B's round 6
    # archived round 5's records with their selection, and commits its own with its grid, before any tuned record
    assert (REPO / "results" / "cpu" / "sft_rl" / "lr_selection.json").is_file()
    tuned = list((REPO / "results" / "cpu" / "async_pp").rglob("lr~tuned/**/metrics.json"))
    assert (REPO / "results" / "cpu" / "async_pp" / "lr_selection.json").is_file() or not tuned
