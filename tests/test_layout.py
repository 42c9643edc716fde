"""The house's shape, checked: every study has the same nine modules, shared code names no study, config is built by
one builder, aggregates never parse paths, and no test imports another test module (docs/house.md)."""

import ast
import importlib
import re
import shutil
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


# A results root in a rules file, a config or a study's rules.py: `results/<scale>`, `{RESULTS}` (or `{results}`,
# any name holding "results"), `RESULTS + "/..."`, `os.path.join(RESULTS, "...")` and `Path(RESULTS) / "..."`.
_ROOT = r"\w*results\w*"
_FOREIGN = [r"(?:results/[\w{}.-]+|\{" + _ROOT + r"\})/({studies})\b",
            _ROOT + r"\s*\+\s*f?[\"']/({studies})\b",
            r"os\.path\.join\(\s*" + _ROOT + r"\s*,\s*f?[\"']({studies})\b",
            _ROOT + r"\)?\s*/\s*f?[\"']({studies})\b"]


def _foreign_results_paths(text: str, own: str | None) -> list[str]:
    """Paths into another study's results folder in a rules file, config or a study's rules.py, in any of the forms
    of `_FOREIGN`: one study reads another's files only through cross_study_input and that study's rules.EXPORTS."""
    studies = "|".join(STUDIES)
    found = {s for pattern in _FOREIGN
             for s in re.findall(pattern.replace("{studies}", studies), text, re.IGNORECASE)}
    return sorted(s for s in found if s != own)


def _owner(path: Path) -> str | None:
    """The study a file belongs to: workflow/rules/<study>.smk, config/<scale>/<study>.yaml,
    studies/<study>/rules.py; None for shared files."""
    for name in (path.stem, path.parent.name):
        if name in STUDIES:
            return name
    return None


def _checked_files(root: Path) -> list[Path]:
    return (sorted((root / "workflow" / "rules").glob("*.smk")) + sorted((root / "config").glob("*/*.yaml"))
            + sorted((root / "src" / "gradfidelity" / "studies").glob("*/rules.py")))


def _offenders(root: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(root)): bad for p in _checked_files(root)
            if (bad := _foreign_results_paths(p.read_text(), _owner(p)))}


def test_no_rules_file_config_or_study_rules_names_another_studys_results():
    offenders = _offenders(REPO)
    assert not offenders, f"paths into another study's results (use cross_study_input / rules.EXPORTS): {offenders}"


def test_a_planted_cross_study_path_is_caught():
    planted = 'data: {corpus: file, path: results/cpu/local/corpus/python-docs-3.11.txt}'
    assert _foreign_results_paths(planted, "async_pp") == ["local"]
    assert _foreign_results_paths('input: f"{RESULTS}/sft_rl/base/seed0/metrics.json"', "ds_audit") == ["sft_rl"]
    # its own folder, and a study-less path, are fine
    assert _foreign_results_paths('f"{RESULTS}/local/data/{{corpus}}/meta.json"', "local") == []
    assert _foreign_results_paths('f"{RESULTS}/runs/{{study}}.csv"', None) == []
    assert _foreign_results_paths('RESULTS + "/runs.csv"', None) == []


PLANTED = {  # issue 56: the forms round 5's layout test missed, each planted where it would hide
    "concatenation": ("workflow/rules/async_pp.smk", 'CORPUS = RESULTS + "/local/corpus/python-docs.txt"\n'),
    "os.path.join": ("workflow/rules/async_pp.smk", 'CORPUS = os.path.join(RESULTS, "local", "corpus")\n'),
    "pathlib": ("workflow/rules/ds_audit.smk", 'GRAMS = Path(RESULTS) / "sft_rl" / "alignment"\n'),
    "literal in rules.py": ("src/gradfidelity/studies/async_pp/rules.py",
                            'CORPUS = "results/cpu/local/corpus/python-docs-3.11.txt"\n'),
    "f-string in rules.py": ("src/gradfidelity/studies/ds_audit/rules.py",
                             'GRAMS = lambda results: f"{results}/sft_rl/tiny-qwen2/alignment"\n'),
}


@pytest.fixture(scope="module")
def layout_copy(tmp_path_factory):
    """The files the cross-study path check reads, copied as they are."""
    root = tmp_path_factory.mktemp("layout")
    for path in _checked_files(REPO):
        (root / path.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, root / path.relative_to(REPO))
    return root


@pytest.mark.parametrize("form", sorted(PLANTED))
def test_each_planted_form_is_caught_in_a_copy(layout_copy, tmp_path, form):
    root = tmp_path / "copy"
    shutil.copytree(layout_copy, root)
    assert _offenders(root) == {}  # the copy is clean before planting
    rel, line = PLANTED[form]
    with open(root / rel, "a") as f:
        f.write(line)
    found = _offenders(root)
    assert list(found) == [rel] and found[rel] in (["local"], ["sft_rl"]), f"{form} not caught: {found}"


# ------------------------------------------------------------------------------------------ the house's arrows
# Rooms of src/gradfidelity: a subpackage (harness, claims, reference, stats, plots, studies) or a top-level module.
# The studies registry (gradfidelity/studies/__init__.py, the one list of names) is a room of its own: shared code
# discovers studies through it, which is not an arrow into a study.
REGISTRY = "studies (registry)"
BELOW_REFERENCE = ("harness", "claims")  # rooms check-reference builds on: they never import it


def _room_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "gradfidelity" or len(parts) < 2:
        return None
    return REGISTRY if parts[1:] == ["studies"] else parts[1]


def _room_of_path(path: Path, src: Path = SRC) -> str:
    rel = path.relative_to(src).parts
    return REGISTRY if rel == ("studies", "__init__.py") else rel[0].removesuffix(".py")


def room_arrows(src: Path = SRC) -> dict[tuple[str, str], set[str]]:
    """(room, room it imports) -> the files that import it: every import, a function's lazy one included."""
    arrows: dict[tuple[str, str], set[str]] = {}
    for path in sorted(src.rglob("*.py")):
        here = _room_of_path(path, src)
        for name in _imports(path):
            there = _room_of_module(name)
            if there and there != here:
                arrows.setdefault((here, there), set()).add(str(path.relative_to(src)))
    return arrows


def _circle(arrows) -> list[str] | None:
    """One circle of rooms (a path back to its start), or None."""
    graph: dict[str, set[str]] = {}
    for a, b in arrows:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}

    def visit(room, path):
        state[room] = 1
        for nxt in sorted(graph.get(room, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt) and (found := visit(nxt, path + [nxt])):
                return found
        state[room] = 2
        return None

    for room in sorted(graph):
        if not state.get(room) and (found := visit(room, [room])):
            return found
    return None


def test_harness_and_claims_import_nothing_from_reference():
    """Issue 56: harness/records.py and claims/report.py imported reference/check.py (RECORD, record_digest,
    compare): two arrows pointing back up. The record comparison lives in harness/record_compare.py."""
    back = {f"{a} -> {b}": sorted(files) for (a, b), files in room_arrows().items()
            if a in BELOW_REFERENCE and b == "reference"}
    assert not back, f"arrows back up into reference/: {back}"


def test_no_circle_across_rooms():
    circle = _circle(room_arrows())
    arrows = room_arrows()
    assert circle is None, "a circle across rooms: " + " -> ".join(circle) + "; " + "; ".join(
        f"{a} -> {b}: {sorted(arrows[(a, b)])}" for a, b in zip(circle, circle[1:], strict=False))


def test_a_planted_back_arrow_and_circle_are_caught(tmp_path):
    src = tmp_path / "gradfidelity"
    for rel, text in {"harness/__init__.py": "", "harness/x.py": "def f():\n    from gradfidelity.reference.a "
                      "import B\n", "reference/__init__.py": "", "reference/a.py": "import gradfidelity.claims.c\n",
                      "claims/__init__.py": "", "claims/c.py": "from gradfidelity.harness.x import f\n",
                      "studies/__init__.py": "STUDIES = ()\n", "plots/p.py": "from gradfidelity.studies import S\n"
                      }.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    arrows = room_arrows(src)
    assert arrows[("harness", "reference")] == {"harness/x.py"}  # a function's lazy import counts
    assert _circle(arrows) == ["claims", "harness", "reference", "claims"]
    assert ("plots", REGISTRY) in arrows and _circle({("plots", REGISTRY): set()}) is None
