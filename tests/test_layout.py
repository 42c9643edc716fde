"""The house's shape, checked: every study has the same nine modules, shared code names no study, config is built by
one builder, aggregates never parse paths, and no test imports another test module (docs/house.md)."""

import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

from gradfidelity.config import schema_mismatches
from gradfidelity.studies import STUDIES

SRC = Path(__file__).resolve().parents[1] / "src" / "gradfidelity"
REPO = SRC.parents[1]
LAYOUT = ("config", "plan", "rules", "train", "aggregate", "claims", "tables", "figures", "cli")
# The public import path of the Trainer guard, kept for users' scripts: the one shared module allowed to name a study.
REEXPORTS = {SRC / "guard.py"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_has_the_nine_modules(study):
    missing = [m for m in LAYOUT if not (SRC / "studies" / study / f"{m}.py").is_file()]
    assert not missing, f"studies/{study} lacks {missing} (docs/house.md)"


def test_shared_code_names_no_study():
    offenders = {}
    for path in SRC.rglob("*.py"):
        if "studies" in path.relative_to(SRC).parts[:1] or path in REEXPORTS:
            continue
        bad = {n for n in _imports(path) if n.startswith("gradfidelity.studies.")}
        text = path.read_text()
        bad |= set(re.findall(r"gradfidelity\.studies\.(?:{})\b".format("|".join(STUDIES)), text))
        if bad:
            offenders[str(path.relative_to(SRC))] = sorted(bad)
    assert not offenders, f"shared modules that name a study (discover studies through STUDIES): {offenders}"


def test_no_study_imports_another():
    for study in STUDIES:
        others = {f"gradfidelity.studies.{s}" for s in STUDIES if s != study}
        for path in (SRC / "studies" / study).rglob("*.py"):
            bad = {n for n in _imports(path) if any(n == o or n.startswith(o + ".") for o in others)}
            assert not bad, f"{path.relative_to(SRC)} imports another study: {bad}"


def test_config_is_built_by_one_builder():
    defs = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if re.search(r"def from_dict\b", p.read_text())]
    assert not defs, f"per-class from_dict (use gradfidelity.config.build): {defs}"


def test_aggregates_never_parse_paths():
    for path in SRC.rglob("*.py"):
        assert 'index("/' not in path.read_text(), f"{path.relative_to(SRC)} rebuilds identity from a path"


@pytest.mark.parametrize("study", STUDIES)
def test_schema_and_typed_config_agree(study):
    """The schema is the one place of every default; the dataclass tree has a field for each key and no default."""
    config = importlib.import_module(f"gradfidelity.studies.{study}.config")
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / f"{study}.schema.yaml").read_text())
    assert schema_mismatches(config.StudyConfig, schema) == []


def test_no_test_imports_another_test_module():
    tests = Path(__file__).resolve().parent
    for path in tests.rglob("*.py"):
        bad = {n for n in _imports(path) if re.search(r"(^|\.)test_\w+$", n)}
        assert not bad, f"{path.relative_to(tests)} imports a test module: {bad} (move shared helpers to a _module)"


def _foreign_results_paths(text: str, own: str | None) -> list[str]:
    """Paths into another study's results folder (`results/<scale>/<study>/` or `{RESULTS}/<study>/`) in a rules file
    or config: one study reads another's files only through cross_study_input and that study's rules.EXPORTS."""
    studies = "|".join(STUDIES)
    found = re.findall(r"(?:results/[\w{}.-]+|\{RESULTS\})/(" + studies + r")\b", text)
    return sorted({s for s in found if s != own})


def _owner(path: Path) -> str | None:
    return path.stem if path.stem in STUDIES else None


def test_no_rules_file_or_config_names_another_studys_results():
    files = sorted((REPO / "workflow" / "rules").glob("*.smk")) + sorted((REPO / "config").glob("*/*.yaml"))
    offenders = {str(p.relative_to(REPO)): bad for p in files
                 if (bad := _foreign_results_paths(p.read_text(), _owner(p)))}
    assert not offenders, f"paths into another study's results (use cross_study_input / rules.EXPORTS): {offenders}"


def test_a_planted_cross_study_path_is_caught():
    planted = 'data: {corpus: file, path: results/cpu/local/corpus/python-docs-3.11.txt}'
    assert _foreign_results_paths(planted, "async_pp") == ["local"]
    assert _foreign_results_paths('input: f"{RESULTS}/sft_rl/base/seed0/metrics.json"', "ds_audit") == ["sft_rl"]
    # its own folder, and a study-less path, are fine
    assert _foreign_results_paths('f"{RESULTS}/local/data/{{corpus}}/meta.json"', "local") == []
    assert _foreign_results_paths('f"{RESULTS}/runs/{{study}}.csv"', None) == []
