"""The drift between host types per arm (issue 60, item 4), on hand-made runs tables: a round-6 run and an archived
run of the same cell, seed and LR value pair up; on one host type they must agree bit for bit, across two their
difference is the drift; a run whose LR value differs is no pair."""

from __future__ import annotations

import pandas as pd
import pytest

from gradfidelity.cli import main
from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.tables import host_drift_table, write_host_drift

AMD = {"cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_number": 17}
INTEL = {"cpu_vendor": "GenuineIntel", "cpu_family": 6, "cpu_model_number": 167}


def _run(optimizer, schedule, seed, loss, host, lr="own", lr_value=0.01, status="ok"):
    return {"optimizer": optimizer, "lr": lr, "head": "untied", "schedule": schedule, "mitigation": "none",
            "depth": 1, "momentum": 0.9, "steps": 512, "seed": seed, "width": 0, "status": status,
            "final_val_loss": loss, "lr_value": lr_value, **host, "scale": "cpu"}


def _tables():
    archive = pd.DataFrame([
        _run("adamw", "sync", 0, 3.0, AMD), _run("adamw", "sync", 1, 3.1, AMD),  # the same host type
        _run("muon", "2bw", 0, 2.50, INTEL), _run("muon", "2bw", 1, 2.60, INTEL),  # the other
        _run("soap", "2bw", 0, 2.70, INTEL, lr_value=0.02),  # its LR moved between the rounds: no pair
    ])
    current = pd.DataFrame([
        _run("adamw", "sync", 0, 3.0, AMD), _run("adamw", "sync", 1, 3.1, AMD),
        _run("muon", "2bw", 0, 2.51, AMD), _run("muon", "2bw", 1, 2.57, AMD),
        _run("muon", "2bw", 0, 2.51, AMD, lr="tuned"),  # own = sync's choice: the same training, one pair
        _run("soap", "2bw", 0, 2.90, AMD, lr_value=0.01),
    ])
    return current, archive


def test_same_host_pairs_agree_and_cross_host_pairs_give_each_arms_drift():
    table = host_drift_table(*_tables()).set_index(["host_archive", "optimizer"])
    same = table.loc[("AuthenticAMD 25/17", "adamw")]
    assert (same["pairs"], same["bit_identical"], same["max_abs_diff"]) == (2, 2, 0.0)
    muon = table.loc[("GenuineIntel 6/167", "muon")]
    assert muon["pairs"] == 2 and muon["bit_identical"] == 0  # the tuned duplicate counts once
    assert muon["max_abs_diff"] == pytest.approx(0.03) and muon["median_abs_diff"] == pytest.approx(0.02)
    assert muon["mean_diff"] == pytest.approx((0.01 - 0.03) / 2)
    # the false case: SOAP's LR value moved, so its runs are different trainings and never pair
    assert "soap" not in table.index.get_level_values("optimizer")
    every = table.loc[("GenuineIntel 6/167", "every arm")]
    assert every["pairs"] == 2 and every["host"] == "AuthenticAMD 25/17"


def test_a_same_host_pair_that_disagrees_is_refused_naming_the_archive(tmp_path):
    current, archive = _tables()
    current.loc[0, "final_val_loss"] = 3.0001  # the same training on the same host type, another loss
    with pytest.raises(UserError, match=r"round5: 1 run\(s\) trained twice on one host type.*does not stand"):
        write_host_drift(current, archive, str(tmp_path / "d.csv"), "round5")
    assert not (tmp_path / "d.csv").exists()
    current, archive = _tables()
    current.loc[4, "final_val_loss"] = 2.52  # lr~tuned, the same training as row 2's lr~own, another loss
    with pytest.raises(UserError, match=r"1 cell\(s\) trained twice in one round on one host type"):
        write_host_drift(current, archive, str(tmp_path / "d.csv"), "round5")
    write_host_drift(*_tables(), str(tmp_path / "d.csv"), "round5")
    assert "same cell, seed and LR value" in (tmp_path / "d.md").read_text()


def test_the_report_command_writes_the_table_and_asks_for_the_archive(tmp_path):
    current, archive = _tables()
    current.to_csv(tmp_path / "runs.csv", index=False)
    archive.to_csv(tmp_path / "archive.csv", index=False)
    common = ["async-pp-report", "--cfg", "{}", "--runs", str(tmp_path / "runs.csv"), "--scale", "cpu"]
    assert main([*common, "--archive-runs", str(tmp_path / "archive.csv"), "--host-drift-table",
                 str(tmp_path / "t.csv")]) == 0
    assert len(pd.read_csv(tmp_path / "t.csv")) == 4  # two host pairs, each with its every-arm row and one arm
    assert main([*common, "--host-drift-table", str(tmp_path / "u.csv")]) == 2  # no --archive-runs
    assert main([*common, "--scale", "smoke", "--archive-runs", str(tmp_path / "archive.csv"),
                 "--host-drift-table", str(tmp_path / "v.csv")]) == 2  # runs of another scale are refused
