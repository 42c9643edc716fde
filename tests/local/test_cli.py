"""Bad config or data is a one-line UserError (exit 2) naming the key or path, before any work."""

from __future__ import annotations

import json

from gradfidelity.cli import main

GOOD = {"widths": [16], "main_width": 16, "seeds": 2, "corpora": {"enwik8": {"source": "embedded"}},
        "train": {"n_layer": 2, "n_stages": 2, "n_head": 2}}


def test_bad_config_key_is_named(tmp_path, capsys):
    cfg = {"enwik8": {"sourse": "embedded"}}
    assert main(["local-data", "--cfg", json.dumps(cfg), "--corpus", "enwik8", "--out", str(tmp_path)]) == 2
    assert "sourse" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    cfg = {**GOOD, "train": {**GOOD["train"], "n_layers": 4}}
    args = ["local-cell", "--cfg", json.dumps(cfg), "--corpus", "enwik8", "--width", "16", "--seed", "0",
            "--methods", "bp", "--data", str(tmp_path), "--root", str(tmp_path / "runs")]
    assert main(args) == 2
    assert "n_layers" in capsys.readouterr().err


def test_missing_data_is_named(tmp_path, capsys):
    args = ["local-cell", "--cfg", json.dumps(GOOD), "--corpus", "enwik8", "--width", "16", "--seed", "0",
            "--methods", "bp", "--data", str(tmp_path / "nowhere"), "--root", str(tmp_path / "runs")]
    assert main(args) == 2
    assert "nowhere/train.bin" in capsys.readouterr().err


def test_path_source_without_file(tmp_path, capsys):
    cfg = {"enwik8": {"source": "path", "path": str(tmp_path / "enwik8.zip")}}
    assert main(["local-data", "--cfg", json.dumps(cfg), "--corpus", "enwik8", "--out", str(tmp_path / "o")]) == 2
    assert "enwik8.zip does not exist" in capsys.readouterr().err


def test_data_folder_without_meta_is_named(tmp_path, capsys):
    (tmp_path / "train.bin").write_bytes(b"x" * 5000)
    (tmp_path / "val.bin").write_bytes(b"x" * 5000)
    args = ["local-cell", "--cfg", json.dumps(GOOD), "--corpus", "enwik8", "--width", "16", "--seed", "0",
            "--methods", "bp", "--data", str(tmp_path), "--root", str(tmp_path / "runs")]
    assert main(args) == 2
    assert "meta.json does not exist" in capsys.readouterr().err
