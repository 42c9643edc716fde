"""Each live run at an earlier RL budget against the earlier record of its cell (earlier.py, issue 46), on hand-made
records: identical records on the same host type pass and say so, one changed number there is a loud error naming
the run, on another host type the differences are measured against the earlier seed spread, and a cell whose LR
changed is shown but left out of the summary."""

import json
from pathlib import Path

import pandas as pd
import pytest

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_json
from gradfidelity.harness.results import load_run_records
from gradfidelity.studies.sft_rl import aggregate as agg
from gradfidelity.studies.sft_rl.earlier import write_comparison
from gradfidelity.studies.sft_rl.plan import earlier_records
from tests.sft_rl._runs import SCALE, _two_budgets

AMD = {"cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_number": 17, "cpu_stepping": 1,
       "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f", "cpu_isa_limits": "none"}
INTEL = {**AMD, "cpu_vendor": "GenuineIntel", "cpu_family": 6, "cpu_model_number": 167}


def _provenance(path: str, machine: dict) -> None:
    rec = json.loads(Path(path).read_text())
    atomic_write_json(Path(path).parent / "provenance.json", {"seed": rec["seed"], "status": rec["status"],
                                                              "machine": machine})


def _earlier(tmp_path, paths: list[str], machine: dict, change=None, lr=None) -> str:
    """The earlier records of a 5-step RL stage: each live run as it stood at step 5 (its at_step block, its
    histories cut; the truncated arm at step 1), SFT and base as they are; `change`: a run (path part) whose acc_id
    moves by 1 point; `lr`: {path part: another LR}."""
    folder = tmp_path / "earlier"
    for path in paths:
        rec = json.loads(Path(path).read_text())
        m = rec["metrics"]
        if rec["cell"].get("stage") == "rl":
            at = m.pop("at_step")
            m.update({k: v for k, v in at["5"].items() if k != "rl_steps"})
            for h in ("reward_history", "loss_history", "zero_adv_history"):
                m[h] = m[h][:5]
            if "truncated" in m:
                m["truncated"] = at["1"]
        for part, new_lr in (lr or {}).items():
            if part in path:
                m["lr"] = new_lr
        if change and change in path:
            m["acc_id"] += 1.0
        out = folder / Path(path).relative_to(tmp_path / "results" / "sft_rl")
        atomic_write_json(out, rec)
        _provenance(str(out), machine)
    return str(folder)


def _live(tmp_path, machine: dict):
    cfg, paths = _two_budgets(tmp_path)
    for p in paths:
        _provenance(p, machine)
    df = agg.collect(cfg, load_run_records(paths, scale=SCALE))
    return cfg, paths, df


def test_the_same_host_type_gives_identical_records_and_says_so(tmp_path):
    cfg, paths, df = _live(tmp_path, AMD)
    folder = _earlier(tmp_path, paths, AMD)
    csv, md = tmp_path / "t.csv", tmp_path / "t.md"
    table = write_comparison(cfg, df, folder, earlier_records(folder), 5, SCALE, csv, md)
    assert (table.identical == "yes").all() and (table.same_host_type == "yes").all()
    assert set(table.method) >= {"base", "sft", "sft_then_rl", "sft_then_rl_truncated", "luffy"}
    assert len(table) == len(df[df.budget == 5])  # every cell and seed on both sides
    text = md.read_text()
    assert "every kept-LR run is identical" in text and "luffy: 3 runs, 3 identical" in text
    assert pd.read_csv(csv).acc_id_diff.abs().max() == 0


def test_one_changed_number_on_the_same_host_type_is_a_loud_error(tmp_path):
    cfg, paths, df = _live(tmp_path, AMD)
    folder = _earlier(tmp_path, paths, AMD, change="/fixed/srft/seed1/")
    with pytest.raises(UserError, match=r"1 runs at 5 RL steps differ .*fixed/srft/seed1"):
        write_comparison(cfg, df, folder, earlier_records(folder), 5, SCALE, tmp_path / "t.csv", tmp_path / "t.md")


def test_another_host_type_is_measured_and_a_changed_lr_is_left_out_of_the_summary(tmp_path):
    cfg, paths, df = _live(tmp_path, INTEL)
    folder = _earlier(tmp_path, paths, AMD, change="/fixed/srft/seed1/", lr={"/fixed/hpt/": 1e-5})
    table = write_comparison(cfg, df, folder, earlier_records(folder), 5, SCALE, tmp_path / "t.csv",
                             tmp_path / "t.md")
    srft = table[(table.method == "srft") & (table.seed == 1)].iloc[0]
    assert srft.identical == "no" and srft.acc_id_diff == pytest.approx(-1.0) and srft.same_host_type == "no"
    assert (table[table.method == "hpt"].same_lr == "no").all()
    assert (table[table.method == "sft"].same_lr == "-").all()
    text = (tmp_path / "t.md").read_text()
    assert "another host type" in text and "GenuineIntel" in text and "AuthenticAMD" in text
    assert "srft: 3 runs, 2 identical" in text and "hpt:" not in text.split("identical: every")[1]


def test_no_earlier_records_and_a_budget_the_runs_lack_are_refused(tmp_path):
    from tests.sft_rl._config import make_cfg

    with pytest.raises(UserError, match="no metrics.json under"):
        earlier_records(str(tmp_path))
    with pytest.raises(UserError, match=r"compare_with.rl_steps: 7 is not one of this config's RL budgets \[5, 10\]"):
        make_cfg({"rl": {"steps": 10, "eval_steps": [5]}, "compare_with": {"records": "x", "rl_steps": 7}})


def test_a_table_with_no_finished_pair_says_so():
    from gradfidelity.studies.sft_rl.earlier import summary_lines

    assert summary_lines(pd.DataFrame([{"status": "diverged -> ok"}])) == ["no cell finished on both sides"]
