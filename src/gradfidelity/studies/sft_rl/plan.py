"""Which runs a config needs and where each table cell reads its numbers (shared by the rules and aggregate).

Pure Python on the raw config dict (no torch import), so workflow/rules/sft_rl.smk can call it at parse time
and the aggregation reads exactly the runs the DAG produced.

Layout: results/sft_rl/<model>/base/seed0/                 the base model (one per model, shared by all)
        results/sft_rl/<model>/<variant>/sft/seed<k>/      SFT on the variant's infrastructure
        results/sft_rl/<model>/<variant>/<method>/seed<k>/ an RL-stage method (GRPO or mixed-policy)
The truncated SFT-then-RL is read off the sft_then_rl run at its truncation step (constant LR, same RNG
stream, so the first k steps of the long run are the k-step run).
"""

from __future__ import annotations

RL_STAGE = ("rl", "sft_then_rl", "luffy", "srft", "relift", "hpt")
MIXED = ("luffy", "srft", "relift", "hpt")
TABLE_VARIANTS = ("fixed", "both")


def stage_variant(raw: dict, variant: str, stage: str) -> str:
    return variant if stage in raw.get("bug_stages", ["sft"]) else "fixed"


def rl_run_variant(raw: dict, method: str, variant: str) -> str:
    """Run directory variant of an RL-stage method's (method, variant) cell: shared with `fixed` when no stage
    of it runs on buggy infrastructure under this variant."""
    if method == "sft_then_rl" and stage_variant(raw, variant, "sft") != "fixed":
        return variant
    return stage_variant(raw, variant, "rl")


def base_dir(root: str, model: str) -> str:
    return f"{root}/{model}/base/seed0"


def run_dir(root: str, model: str, variant: str, method: str, seed: int) -> str:
    return f"{root}/{model}/{variant}/{method}/seed{seed}"


def init_dir(raw: dict, root: str, model: str, variant: str, method: str, seed: int) -> str:
    """Where an RL-stage run starts: the base model, or (sft_then_rl) the SFT run of the same seed."""
    if method == "sft_then_rl":
        return run_dir(root, model, stage_variant(raw, variant, "sft"), "sft", seed)
    return base_dir(root, model)


def cell_run(raw: dict, variant: str, method: str) -> tuple[str, str]:
    """The (variant, method) of the run a table cell (variant x method) reads: the truncated SFT-then-RL reads
    the sft_then_rl run, and a cell none of whose stages runs on buggy infrastructure reads the fixed run."""
    if method == "sft":
        return stage_variant(raw, variant, "sft"), "sft"
    if method == "sft_then_rl_truncated":
        method = "sft_then_rl"
    return rl_run_variant(raw, method, variant), method


def cell_dir(raw: dict, root: str, model: str, variant: str, method: str, seed: int) -> str:
    """The run directory a table cell (method x variant) reads."""
    return run_dir(root, model, *cell_run(raw, variant, method), seed)


def table_cells(raw: dict) -> list[tuple[str, str]]:
    """Every (variant, method) cell of the tables: each table variant x method, plus SFT on every other variant
    (the bug ablation)."""
    cells = [(v, m) for v in table_variants(raw) for m in raw["methods"]]
    if "sft" in raw["methods"]:
        cells += [(v, "sft") for v in raw["variants"] if v not in TABLE_VARIANTS]
    return cells


def table_variants(raw: dict) -> list[str]:
    return [v for v in TABLE_VARIANTS if v in raw["variants"]]


def planned_runs(raw: dict, root: str) -> list[str]:
    """metrics.json of every training run the config asks for (the aggregate rule's inputs)."""
    runs: set[str] = set()
    models = [m["name"] for m in raw["models"]]
    methods = raw["methods"]
    for model in models:
        for seed in raw["seeds"]:
            if "sft" in methods:  # the bug ablation: SFT on every variant
                for v in raw["variants"]:
                    runs.add(run_dir(root, model, stage_variant(raw, v, "sft"), "sft", seed))
            for v in table_variants(raw):
                for method in methods:
                    if method in RL_STAGE or method == "sft_then_rl_truncated":
                        runs.add(cell_dir(raw, root, model, v, method, seed))
    return sorted(f"{r}/metrics.json" for r in runs)
