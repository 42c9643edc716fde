"""Config overrides: merged key by key at every depth, command-line strings read as numbers where the schema asks
for one, a wrong key at any depth (the top level included) refused before any job, naming the key."""

import json
import re

import pytest
from snakemake.utils import update_config

from gradfidelity.config import coerce_cli_strings, validate_section
from gradfidelity.errors import UserError
from tests._snakemake import REPO
from tests._snakemake import smk as _smk

SCHEMA = {"type": "object", "additionalProperties": False, "definitions": {"n": {"type": "integer"}},
          "properties": {"train": {"type": "object", "additionalProperties": False,
                                   "properties": {"steps": {"$ref": "#/definitions/n"},
                                                  "lr": {"type": "number"}, "name": {"type": "string"},
                                                  "widths": {"type": "array", "items": {"type": "integer"}}}}}}


def test_the_merge_the_workflow_uses_keeps_siblings_at_every_depth():
    section = {"train": {"steps": 40, "model": {"n_layer": 4, "width": 64}}, "seeds": 2}
    update_config(section, {"train": {"model": {"width": 32}}})
    assert section == {"train": {"steps": 40, "model": {"n_layer": 4, "width": 32}}, "seeds": 2}
    scalar = {"a": {"b": 1}}
    update_config(scalar, {"a": 5})
    assert scalar == {"a": 5}  # a scalar override replaces a mapping


def test_cli_strings_become_numbers_only_where_the_schema_wants_numbers():
    got = coerce_cli_strings({"train": {"steps": "10", "lr": "3e-4", "name": "10", "widths": ["64", "128"]}},
                             SCHEMA, "s")
    assert got == {"train": {"steps": 10, "lr": 3e-4, "name": "10", "widths": [64, 128]}}
    bad = coerce_cli_strings({"train": {"steps": "ten"}}, SCHEMA, "s")
    assert bad == {"train": {"steps": "ten"}}  # left for the schema check, which names the key


def test_unknown_nested_key_is_named(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(SCHEMA))
    with pytest.raises(UserError, match=r"'s\.train\.stepz'"):
        validate_section({"train": {"stepz": 1}}, path, "s")


def _local_cell_cfg(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if "local-cell" in line)
    return json.loads(re.search(r"--cfg '(\{.*?\})'", line).group(1))


def test_configfile_override_merges_into_the_smoke_section(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("local: {train: {steps: 10}}\n")
    res = _smk("-n", "-p", "--forceall", "--configfile", str(path))
    assert res.returncode == 0, res.stderr[-2000:]
    cfg = _local_cell_cfg(res.stdout)
    import yaml

    smoke = yaml.safe_load((REPO / "config" / "smoke" / "local.yaml").read_text())["train"]
    assert cfg["train"]["steps"] == 10
    for key in ("n_layer", "n_stages", "block_size"):
        assert cfg["train"][key] == smoke[key], key


def test_nested_command_line_override_gives_numbers():
    res = _smk("-n", "-p", "--forceall", "--config", "local={train: {steps: 10}}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert _local_cell_cfg(res.stdout)["train"]["steps"] == 10


@pytest.mark.parametrize("entry,key", [("bogus_key=1", "'bogus_key'"),
                                       ("local={train: {stepz: 10}}", "'local.train.stepz'"),
                                       # one window gives A3's alignment no interval: refused before any work
                                       ("sft_rl={alignment_windows: 1}", "'sft_rl.alignment_windows'")])
def test_bad_key_at_any_depth_fails_before_any_job(entry, key):
    res = _smk("-n", "--config", entry)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and key in out and "Job stats" not in out
