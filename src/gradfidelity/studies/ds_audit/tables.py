"""Paper tables of the study: the fault matrix, the loss aggregation and the norm alignment (CSV and Markdown each).

Why Markdown lists disagreements first: a reader must not have to scan 300 rows to learn that a row contradicts the
prediction of the paper's bug description (docs/sources.md, "Study A: DeepSpeed bug"); the section says so plainly,
and the full table follows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gradfidelity.harness.io import atomic_write_csv, atomic_write_text
from gradfidelity.tables import markdown


def _md_table(df: pd.DataFrame) -> str:
    """A Markdown table whose text cells cannot break the table (DeepSpeed error text may hold "|" or newlines)."""
    clean = df.astype(object).mask(df.isna(), "")  # empty cells, not "nan", for values a row did not report
    for col in clean.columns:
        clean[col] = clean[col].map(lambda v: v.replace("|", "/").replace("\n", " ") if isinstance(v, str) else v)
    return markdown(clean) + "\n"


def write_matrix_table(df: pd.DataFrame, csv: Path, md: Path) -> None:
    """The matrix (`aggregate.matrix_frame`, in table order) to CSV (without the raw `result`) and Markdown."""
    atomic_write_csv(df.drop(columns=["result"], errors="ignore"), csv)
    shown = ["deepspeed", "ranks", "zero_stage", "offload", "ga", "backward_calls", "boundary", "clip_mode", "dtype",
             "status", "contributions", "clip_used", "clip_applied", "clip_full", "reported_over_kept", "predicted",
             "agrees_with_prediction", "error"]
    ok = df[df.status == "ok"]
    lines = [
        "# DeepSpeed fault matrix: which micro-batches reach the optimizer",
        "",
        "Several consecutive optimizer steps per row through the real `deepspeed.initialize` (CPU accelerator, gloo), "
        "SGD(lr=1) as a client optimizer, a probe model where micro-batch k alone touches parameter tag[k]. "
        "`contributions` is, per step (separated by |), the least-squares weight of each micro-batch (all ranks, "
        "rank-major) in the applied gradient: 1 = counted once, 0 = lost. `clip_mode`: off (clipping 0), active "
        "(threshold 1.0, faithful norm 2.0), silent (no gradient_clipping key: the version's default, `clip_used`). "
        "`clip_applied` = applied norm / norm of the kept micro-batches; `clip_full` = the coefficient the full "
        "gradient would give; `reported_over_kept` = reported norm / norm of the kept micro-batches. `boundary` "
        "(several backward() per step): manual = set_gradient_accumulation_boundary, none = not called. "
        "`predicted` is the vector the "
        "paper's bug description (docs/sources.md, Study A) predicts for the row; `agrees_with_prediction` says yes, "
        "NO, open (the description leaves the row open) or error (the row did not run; the error text is kept).",
        "",
        f"Rows: {len(df)}; ran: {len(ok)}; errors: {int((df.status != 'ok').sum())}; "
        f"agree: {int((df.agrees_with_prediction == 'yes').sum())}; "
        f"DISAGREE: {int((df.agrees_with_prediction == 'NO').sum())}; "
        f"open: {int((df.agrees_with_prediction == 'open').sum())}.",
        "",
        "## Rows that disagree with the prediction",
        "",
    ]
    bad = df[df.agrees_with_prediction == "NO"]
    lines.append(_md_table(bad[shown]) if len(bad) else "None: every row that ran matches the prediction.\n")
    lines += ["", "## Rows on the prediction's open questions", ""]
    opn = df[df.agrees_with_prediction == "open"]
    lines.append(_md_table(opn[shown]) if len(opn) else "None.\n")
    lines += ["", "## Rows that could not run", ""]
    err = df[df.status != "ok"]
    lines.append(_md_table(err[shown]) if len(err) else "None.\n")
    lines += ["", "## All rows", "", _md_table(df[shown])]
    atomic_write_text(md, "\n".join(lines))


def write_loss_tables(df: pd.DataFrame, summ: pd.DataFrame, csv: Path, md: Path) -> None:
    """The loss-aggregation rows (`aggregate.loss_frame`) to CSV, their summary (`aggregate.loss_summary`) to MD."""
    atomic_write_csv(df, csv)
    text = [
        "# Loss aggregation over one accumulation window",
        "",
        "Gradient of (a) the global token mean over the window (correct), (b) a token mean per micro-batch averaged "
        "over micro-batches (OpenRLHF before its fix), (c) a per-sequence mean, on a tiny Llama. `weight_min/max`: "
        "effective per-token weight relative to (a)'s 1/T; `rel_error` = ||g - g_a|| / ||g_a||; `cosine` to g_a. "
        "Sequence lengths ~ U[mean (1 - spread), mean (1 + spread)]; means over seeds.",
        "",
        _md_table(summ),
    ]
    atomic_write_text(md, "\n".join(text))


def write(groups: list[str], loss: str, alignment_run: str, out: dict[str, str], scale: str) -> None:
    """The table job: the group runs, the loss-aggregation run and the sft_rl alignment run -> the paper tables at
    `out` (plan.TABLES' names). The alignment table's interval is at A3's level, the claim it feeds."""
    from gradfidelity.claims.evidence import level_for
    from gradfidelity.studies.ds_audit import aggregate, alignment

    write_matrix_table(aggregate.matrix_frame(aggregate.ok_runs(groups, scale)), Path(out["matrix_csv"]),
                       Path(out["matrix_md"]))
    (loss_run,) = aggregate.ok_runs([loss], scale)
    df = aggregate.loss_frame(loss_run)
    write_loss_tables(df, aggregate.loss_summary(df), Path(out["loss_csv"]), Path(out["loss_md"]))
    (align_run,) = aggregate.ok_runs([alignment_run], scale)
    alignment.write_tables(align_run["metrics"], Path(out["alignment_csv"]), Path(out["alignment_md"]),
                           level=level_for("A3"))
