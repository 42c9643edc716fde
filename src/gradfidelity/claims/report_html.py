"""Is the committed HTML report current? Snakemake's report embeds every file it shows (claims.md, the claims
figure, each study's tables and figures) as a base64 data URI in one `var results = {...}` block; a report is
current when each embedded copy equals the file in the checkout.

Compared by content, not by modification time: a clean git clone gives every file the time of the checkout, so
mtimes say nothing there.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from gradfidelity.errors import UserError

_RESULTS = re.compile(r'<script id="results">\s*var results = (\{.*?\});\s*</script>', re.S)


def embedded_files(html: str) -> dict[str, bytes]:
    """path (as the workflow named it) -> the bytes the report shows for it."""
    m = _RESULTS.search(html)
    if not m:
        raise UserError("no `var results` block: not a Snakemake HTML report")
    files = {}
    for path, rec in json.loads(m[1]).items():
        header, _, data = rec.get("data_uri", "").partition(",")
        if not header.endswith(";base64"):
            raise UserError(f"the report shows {path} without a base64 data URI")
        files[path] = base64.b64decode(data)
    return files


def stale_files(report: str | Path, root: str | Path) -> list[str]:
    """Every file the report shows whose copy in `root` differs from the embedded one (or is gone): empty when the
    report is current."""
    shown = embedded_files(Path(report).read_text(encoding="utf-8"))
    stale = []
    for path, data in sorted(shown.items()):
        here = Path(root) / path
        if not here.is_file():
            stale.append(f"{path} (not in the checkout)")
        elif here.read_bytes() != data:
            stale.append(path)
    return stale
