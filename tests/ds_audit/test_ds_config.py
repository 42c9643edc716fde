"""The typed config (one dataclass tree, defaults in the schema only), its cross-field checks, and the per-job keys
of the rules: editing a key changes the `--cfg` of exactly the jobs that read it (Snakemake reruns on params)."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from gradfidelity.config import SCHEMAS, build, schema_mismatches, validate_section
from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit import config, plan, rules

REPO = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((REPO / "workflow/schemas/ds_audit.schema.yaml").read_text())


def _section(scale: str = "smoke") -> dict:
    return yaml.safe_load((REPO / f"config/{scale}/ds_audit.yaml").read_text())


def test_dataclasses_and_schema_agree():
    assert schema_mismatches(config.StudyConfig, SCHEMA) == []


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_every_committed_config_loads(scale):
    cfg = config.load(_section(scale))
    assert cfg.matrix.versions == ("0.18.9", "0.19.8") and isinstance(cfg.matrix.case_timeout_s, float)
    assert len(plan.group_runs(cfg, "results/x")) == len(cfg.matrix.versions) * len(cfg.matrix.ranks)


def test_schema_fills_the_defaults():
    cfg = config.load({"matrix": {}, "loss_aggregation": {}})
    assert cfg.matrix.clipping.ga == (1, 8) and cfg.loss_aggregation.spreads[-1] == 0.95


def test_unknown_key_names_the_key():
    with pytest.raises(UserError, match="ds_audit.matrix.clipping"):
        config.load({"matrix": {"clipping": {"mode": ["active"]}}, "loss_aggregation": {}})


@pytest.mark.parametrize(("patch", "key"), [
    ({"matrix": {"zero_stages": [2, 2]}}, "ds_audit.matrix.zero_stages"),
    ({"matrix": {"clipping": {"ga": [8, 8]}}}, "ds_audit.matrix.clipping.ga"),
    ({"matrix": {"versions": []}}, "ds_audit.matrix.versions"),
    ({"matrix": {"zero_stages": [], "multi_backward": {"calls": 1}, "clipping": {"modes": []}}}, "ds_audit.matrix'"),
    ({"loss_aggregation": {"spreads": [0.0, 0.2, 0.2]}}, "ds_audit.loss_aggregation.spreads"),
])
def test_cross_field_checks_name_the_key(patch, key):
    section = {"matrix": {}, "loss_aggregation": {}}
    for k, v in patch.items():
        section[k] = v
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        config.load(section)


def _cfgs(section: dict) -> dict[str, str]:
    """Each training job's `--cfg` from a section validated (defaults filled) as the workflow does at load."""
    filled = validate_section(section, SCHEMAS / "ds_audit.schema.yaml", "ds_audit")
    return {job: rules.job_cfg(filled, job) for job in ("matrix_group", "loss_agg")}


@pytest.mark.parametrize(("edit", "changed"), [
    (("loss_aggregation", "seeds", 7), {"loss_agg"}),
    (("matrix", "steps", 2), {"matrix_group"}),
    (("matrix", "versions", ["0.19.8"]), set()),  # which groups exist: the plan, not any job's input
    (("matrix", "ranks", [1, 2, 4]), set()),
])
def test_an_edit_changes_the_cfg_of_exactly_the_jobs_that_read_it(edit, changed):
    before = _cfgs(_section())
    section = _section()
    sub, key, value = edit
    section[sub][key] = value
    after = _cfgs(section)
    assert {job for job in before if before[job] != after[job]} == changed


def test_a_job_cfg_builds_the_typed_config_of_its_sections_only():
    raw = json.loads(shlex.split(_cfgs(_section())["matrix_group"])[0])
    cfg = build(config.StudyConfig, raw, "ds_audit")
    assert cfg.loss_aggregation is None and cfg.matrix.versions is None and cfg.matrix.steps == 3
    assert set(rules.JOB_KEYS) == {"matrix_group", "loss_agg", "tables", "figures", "claims"}
