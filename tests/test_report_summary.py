"""The HTML report's landing page: valid reStructuredText (no docutils error, the figure embedded as an image),
with the scale, git sha, machine and verdict counts taken from the files it is given."""

import pandas as pd
from docutils.core import publish_parts

from gradfidelity.claims.summary import write_summary


def test_summary_renders_with_the_figure_and_the_counts(tmp_path):
    claims = pd.DataFrame({"id": ["A1", "B1", "C5"], "verdict": ["reproduced", "not measured at this scale",
                                                              "arithmetic checked"],
                           "evidence": ["measured", "measured", "arithmetic"]})
    claims.to_csv(tmp_path / "claims.csv", index=False)
    (tmp_path / "claims.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    pd.DataFrame({"git_sha": ["abc123"], "git_dirty": [False], "cpu_model": ["Test CPU"], "cpu_count": [2],
                  "status": ["diverged"]}).to_csv(tmp_path / "runs.csv", index=False)
    out = tmp_path / "summary.rst"
    write_summary(tmp_path / "claims.csv", tmp_path / "claims.png", [tmp_path / "runs.csv"], out, "cpu")
    text = out.read_text()
    assert "scale cpu" in text and "abc123" in text and "Test CPU" in text and "(1 diverged)" in text
    assert "1 reproduced" in text and "1 arithmetic checked" in text
    # the report defines the link targets (categories); here they are stubbed so docutils can resolve them
    links = "\n".join(f".. _{name}: #" for name in ("Claims", "ds_audit", "sft_rl", "async_pp", "local", "stats"))
    html = publish_parts(text + "\n" + links, writer_name="html",
                         settings_overrides={"halt_level": 2, "report_level": 2})["html_body"]
    assert '<img alt="claims figure" src="data:image/png;base64,iVBORw0KGgo' in html
