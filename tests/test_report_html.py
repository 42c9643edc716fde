"""The committed HTML report is current: every file it shows (claims.md and the claims figure first) equals the one
in the checkout. By content, since a clean clone's mtimes are the checkout's."""

import base64
import json
from pathlib import Path

import pytest

from gradfidelity.claims.report_html import embedded_files, stale_files
from gradfidelity.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
REBUILD = ("rebuild it from the current cpu results (README, 'The HTML report of the cpu scale'): verify, "
           "claims-figure, report-summary, then "
           "`.venv/bin/snakemake --config scale=cpu --report results/cpu/report.html`")


def _report(files: dict[str, bytes]) -> str:
    results = {path: {"name": Path(path).name, "data_uri": "data:text/markdown;charset=utf8;filename=x;base64,"
                      + base64.b64encode(data).decode()} for path, data in files.items()}
    return (f'<html><script id="results">\n    var results = {json.dumps(results)};\n    </script>\n'
            '<script id="categories">var categories = {};</script></html>')


def test_a_report_is_stale_when_a_file_it_shows_changed_or_is_gone(tmp_path):
    (tmp_path / "paper_tables").mkdir()
    (tmp_path / "paper_tables" / "claims.md").write_text("13 reproduced\n")
    report = tmp_path / "report.html"
    report.write_text(_report({"paper_tables/claims.md": b"13 reproduced\n"}))
    assert stale_files(report, tmp_path) == []
    (tmp_path / "paper_tables" / "claims.md").write_text("14 reproduced\n")  # a later claims report
    assert stale_files(report, tmp_path) == ["paper_tables/claims.md"]
    report.write_text(_report({"paper_tables/old.md": b"x"}))
    assert stale_files(report, tmp_path) == ["paper_tables/old.md (not in the checkout)"]


def test_a_page_that_is_not_a_snakemake_report_is_refused(tmp_path):
    with pytest.raises(UserError, match="not a Snakemake HTML report"):
        embedded_files("<html>claims</html>")


# Every study's cpu run rebuilds the report in the same commit (CONTRIBUTING, 'Committing a study's cpu results').
def test_the_committed_cpu_report_shows_the_current_claims_and_results():
    report = ROOT / "results" / "cpu" / "report.html"
    shown = embedded_files(report.read_text(encoding="utf-8"))
    assert {"paper_tables/cpu/claims.md", "figures/cpu/claims.png"} <= set(shown)
    stale = stale_files(report, ROOT)
    assert not stale, f"results/cpu/report.html is older than {len(stale)} file(s) it shows: {stale}; {REBUILD}"
