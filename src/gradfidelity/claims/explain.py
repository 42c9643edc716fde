"""`gradfidelity claim ID --scale S`: one claim with everything behind its verdict, and the list of all claims.

The verdict is always recomputed here with `verify.judge` from the study's evidence file
(results/<scale>/claims/<study>.json), never read from a table, so what this prints and what `gradfidelity verify`
reports cannot disagree.
"""

from __future__ import annotations

from pathlib import Path

from gradfidelity.claims.report import interval_text
from gradfidelity.claims.verify import (
    ARITHMETIC_BAD,
    ARITHMETIC_OK,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    SCALES,
    describe_check,
    judge,
    load_evidence,
    load_registry,
)
from gradfidelity.errors import UserError

MAX_RUN_DIRS = 12
NO_EVIDENCE = "no evidence yet"
_TABLE_SUFFIXES = (".csv", ".md", ".tsv", ".json", ".png", ".txt", ".yaml")
_DEFAULT_REASON = {
    REPRODUCED: "the whole interval satisfies the check",
    NOT_REPRODUCED: "the whole interval contradicts the check",
    INCONCLUSIVE: "the interval spans the check's threshold",
    ARITHMETIC_OK: "the recomputed value satisfies the check exactly",
    ARITHMETIC_BAD: "the recomputed value contradicts the check",
}


def evidence_path(study: str, scale: str) -> str:
    """The evidence file of `study` at `scale`, relative to the repository root (also the Snakemake target)."""
    return f"results/{scale}/claims/{study}.json"


def rebuild_command(study: str, scale: str) -> str:
    """The command that rebuilds just this study's evidence file. The target comes first: `--config` takes every
    following word as a KEY=VALUE entry, so a target after it would be read as a (bad) config entry."""
    return f".venv/bin/snakemake -c2 {evidence_path(study, scale)} --config scale={scale}"


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r}; valid scales: {', '.join(SCALES)}")


def _claim(claim_id: str, registry: list[dict]) -> dict:
    for row in registry:
        if row["id"] == claim_id:
            return row
    raise UserError(f"unknown claim id {claim_id!r}; valid ids: {', '.join(r['id'] for r in registry)}")


def _study_evidence(study: str, scale: str, root: Path) -> dict | None:
    """The loaded evidence file of `study` (schema-checked, scale-checked), or None if it does not exist yet."""
    path = Path(root) / evidence_path(study, scale)
    if not path.is_file():
        return None
    return load_evidence([path], scale)[study]


def _fmt(x) -> str:
    if isinstance(x, bool):
        return str(x).lower()
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _level_text(level: float) -> str:
    return f"{100 * level:g}%"


def _estimate_text(rec: dict, level: float) -> str:
    """'1.382 [1.364, 1.4] 95%, n = 5', '3 (exact), n = 12', 'none (why), n = 0'."""
    est = rec.get("estimate")
    n = f"n = {rec.get('n')}"
    if rec.get("parts") and est is None:
        return f"from its parts, {n} (the smallest part's n)"
    if est is None:
        return f"none ({rec.get('detail') or 'no value'}), {n}"
    row = {"exact": bool(rec.get("exact")), "low": rec.get("low"), "high": rec.get("high"),
           "level": rec.get("level") or level}
    interval = interval_text(row) or "no interval"
    return f"{_fmt(est)} {'(exact)' if interval == 'exact' else interval}, {n}"


def _sources(rec: dict) -> list[str]:
    seen = dict.fromkeys(rec.get("sources") or [])
    for part in (rec.get("parts") or {}).values():
        seen.update(dict.fromkeys(part.get("sources") or []))
    return list(seen)


def _is_table(source: str) -> bool:
    return source.startswith(("paper_tables/", "figures/")) or source.lower().endswith(_TABLE_SUFFIXES)


def _gate_lines(gates: list[dict]) -> list[str]:
    if not gates:
        return ["  gates: none (no precondition for this claim)"]
    lines = ["  gates:"]
    for g in gates:
        lines.append(f"    {g['name']}: {'passed' if g['passed'] else 'FAILED'} ({g['reason']})")
    failed = [g["name"] for g in gates if not g["passed"]]
    if failed:
        lines.append(f"  gate outcome: {len(failed)} of {len(gates)} failed ({', '.join(failed)}), so the claim is "
                     "not measured: the number would not mean anything")
    else:
        lines.append(f"  gate outcome: all {len(gates)} passed")
    return lines


def _part_lines(claim: dict, rec: dict, scale: str) -> list[str]:
    checks = claim["check"].get("parts") or {}
    parts = rec.get("parts") or {}
    if not parts:
        return []
    lines = ["  parts:"]
    for name, part in parts.items():
        check = checks.get(name)
        if check is None:
            lines.append(f"    {name}: {_estimate_text(part, claim['level'])} (not a part named in the registry)")
            continue
        sub = dict(claim, id=f"{claim['id']}.{name}", check=check, evidence="measured")
        try:
            verdict, reason = judge(sub, part, True, scale)
        except UserError as exc:
            verdict, reason = "rejected", str(exc)
        why = f" ({reason})" if reason else ""
        lines.append(f"    {name} ({describe_check(check)}): {_estimate_text(part, claim['level'])} -> {verdict}{why}")
    return lines


def _registry_lines(claim: dict) -> list[str]:
    return [
        f"{claim['id']}: {claim['statement']}",
        f"  study: {claim['study']}    paper: {claim['paper']}    evidence kind: {claim['evidence']}    "
        f"scales: {', '.join(claim['scales'])}",
        f"  paper value: {claim['paper_value']}",
        f"  metric: {claim['metric']}",
        f"  check: {describe_check(claim['check'])}",
        f"  why this check tests the claim: {claim['why']}",
        f"  min_n: {claim['min_n']}    interval level: {_level_text(claim['level'])} (two-sided)",
    ]


def explain_claim(claim_id: str, scale: str, root: Path = Path(".")) -> str:
    """Everything behind one claim's verdict at `scale`: registry row, evidence, gates, verdict, sources, command."""
    _check_scale(scale)
    claim = _claim(claim_id, load_registry())
    study, root = claim["study"], Path(root)
    rel = evidence_path(study, scale)
    lines = _registry_lines(claim)
    lines.append("")
    lines.append(f"At scale {scale}:")
    evidence = _study_evidence(study, scale, root)
    if evidence is None:
        verdict, reason = judge(claim, None, False, scale)
        lines += [f"  {NO_EVIDENCE} at scale {scale} ({rel} does not exist)",
                  f"  verdict: {verdict}", f"  reason: {reason}",
                  f"  evidence file: {rel} (not built yet)",
                  "  build just this evidence:", f"    {rebuild_command(study, scale)}"]
        return "\n".join(lines) + "\n"
    rec = evidence["values"].get(claim_id)
    verdict, reason = judge(claim, rec, True, scale)
    if rec is None:
        lines.append(f"  the evidence file has no record for {claim_id}")
    else:
        lines.append(f"  estimate: {_estimate_text(rec, claim['level'])} (min_n = {claim['min_n']})")
        if rec.get("diverged"):
            lines.append(f"  diverged runs left out of the pairing: {rec['diverged']}")
        lines += _part_lines(claim, rec, scale)
        lines += _gate_lines(rec.get("gates") or [])
    lines.append(f"  verdict: {verdict}")
    lines.append(f"  reason: {reason or _DEFAULT_REASON.get(verdict, '')}")
    if rec is not None:
        if rec.get("detail"):
            lines.append(f"  detail: {rec['detail']}")
        lines.append(f"  evidence function: {rec.get('computed_by') or 'unknown (the record does not say)'}")
        sources = _sources(rec)
        runs = [s for s in sources if not _is_table(s)]
        tables = [s for s in sources if _is_table(s)]
        lines.append(f"  run directories ({len(runs)}):" if runs else "  run directories: none named")
        lines += [f"    {s}" for s in runs[:MAX_RUN_DIRS]]
        if len(runs) > MAX_RUN_DIRS:
            lines.append(f"    ... and {len(runs) - MAX_RUN_DIRS} more")
        lines.append(f"  tables ({len(tables)}):" if tables else "  tables: none named")
        lines += [f"    {s}" for s in tables]
    lines += [f"  evidence file: {rel}", "  rebuild just this evidence:", f"    {rebuild_command(study, scale)}"]
    return "\n".join(lines) + "\n"


def _short(text: str, width: int = 72) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def list_claims(scale: str, root: Path = Path(".")) -> str:
    """One line per claim: id, study, verdict at `scale` (or 'no evidence yet'), short statement."""
    _check_scale(scale)
    registry, root = load_registry(), Path(root)
    loaded: dict[str, dict | None | str] = {}
    rows = []
    for claim in registry:
        study = claim["study"]
        if study not in loaded:
            try:
                loaded[study] = _study_evidence(study, scale, root)
            except UserError as exc:
                loaded[study] = f"evidence rejected: {exc}"
        evidence = loaded[study]
        if evidence is None:
            verdict = NO_EVIDENCE
        elif isinstance(evidence, str):
            verdict = _short(evidence, 40)
        else:
            try:
                verdict = judge(claim, evidence["values"].get(claim["id"]), True, scale)[0]
            except UserError as exc:
                verdict = _short(f"evidence rejected: {exc}", 40)
        rows.append((claim["id"], study, verdict, _short(claim["statement"])))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    out = [f"Claims at scale {scale} (`gradfidelity claim ID --scale {scale}` explains one):"]
    out += ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    return "\n".join(out) + "\n"
