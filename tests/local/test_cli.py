"""Bad config or data is a one-line UserError (exit 2) naming the key or path, before any work."""

from __future__ import annotations

import json

from gradfidelity.cli import main
from tests.local._config import job_json

GOOD = job_json("train")
CELL = json.dumps({"corpus": "enwik8", "width": "16", "seed": "0"})


def _cell_args(tmp_path, cfg=GOOD, data=None, cell=CELL):
    return ["local-cell", "--cfg", cfg, "--methods", "bp", "--data", str(data or tmp_path), "--cell", cell,
            "--run-dir", str(tmp_path / "runs" / "{method}" / "seed0")]


def test_bad_config_key_is_named(tmp_path, capsys):
    cfg = {"corpora": {"enwik8": {"sourse": "embedded"}}}
    assert main(["local-data", "--cfg", json.dumps(cfg), "--corpus", "enwik8", "--out", str(tmp_path)]) == 2
    assert "sourse" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    cfg = json.loads(GOOD)
    cfg["train"]["n_layers"] = 4
    assert main(_cell_args(tmp_path, cfg=json.dumps(cfg))) == 2
    assert "n_layers" in capsys.readouterr().err


def test_a_job_not_given_a_key_it_reads_names_it(tmp_path, capsys):
    """The rules pass each job only its keys; a --cfg without one of them is refused, not defaulted."""
    args = ["local-claims", "--cfg", job_json("figures"), "--scale", "cpu", "--aggregate", "a.csv",
            "--memory", "mem.csv", "--main-csv", "m.csv", "--mech-csv", "x.csv", "--mem-csv", "y.csv",
            "--out", str(tmp_path / "c.json")]
    assert main(args) == 2
    assert "local.equivalence_bpb" in capsys.readouterr().err


def test_missing_data_is_named(tmp_path, capsys):
    assert main(_cell_args(tmp_path, data=tmp_path / "nowhere")) == 2
    assert "nowhere/train.bin" in capsys.readouterr().err


def test_cell_without_its_wildcards_is_named(tmp_path, capsys):
    assert main(_cell_args(tmp_path, cell=json.dumps({"corpus": "enwik8", "width": "16"}))) == 2
    assert "--cell" in capsys.readouterr().err


def test_path_source_without_file(tmp_path, capsys):
    cfg = job_json("data", corpora={"enwik8": {"source": "path", "path": str(tmp_path / "enwik8.zip")}})
    assert main(["local-data", "--cfg", cfg, "--corpus", "enwik8", "--out", str(tmp_path / "o")]) == 2
    assert "enwik8.zip does not exist" in capsys.readouterr().err


def test_data_folder_without_meta_is_named(tmp_path, capsys):
    (tmp_path / "train.bin").write_bytes(b"x" * 5000)
    (tmp_path / "val.bin").write_bytes(b"x" * 5000)
    assert main(_cell_args(tmp_path)) == 2
    assert "meta.json does not exist" in capsys.readouterr().err
