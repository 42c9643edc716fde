"""Which runs a config needs and where each table cell reads its numbers (shared by the rules and the aggregate).

Torch-free (the workflow calls it at parse time), on the typed config, so the aggregation reads exactly the runs
the DAG produced. The path functions accept wildcard names ("{model}") as well, which makes them the rules' output
patterns (rules.patterns): one layout, written once.

Layout: results/sft_rl/<model>/base/seed<b>/                a base model (one per model and base seed b)
        results/sft_rl/<model>/<variant>/sft/seed<k>/      SFT on the variant's infrastructure (start/: the
                                                            SFT-then-RL start, sft.start_every)
        results/sft_rl/<model>/<variant>/<method>/seed<k>/ an RL-stage method (GRPO or mixed-policy)
        results/sft_rl/<model>/alignment/seed0/            micro-batch gradient Gram matrices (read by ds_audit's A3)
        results/sft_rl/<model>/lr_grid/<method>/lr<lr>/seed<s>/  an LR-selection run (selection seed s, fixed)
        results/sft_rl/lr_rounds/round<k>.json              the LR grid's rounds; lr_selection.json the choices
The truncated SFT-then-RL is read off the sft_then_rl run at its truncation step (constant LR, same RNG
stream, so the first k steps of the long run are the k-step run).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gradfidelity.errors import UserError

if TYPE_CHECKING:
    from gradfidelity.studies.sft_rl.config import StudyConfig

VARIANTS = ("fixed", "ds_bug", "agg_bug", "both")
RL_STAGE = ("rl", "sft_then_rl", "luffy", "srft", "relift", "hpt")
MIXED = ("luffy", "srft", "relift", "hpt")
TABLE_VARIANTS = ("fixed", "both")
TABLES = ("main_csv", "main_md", "abl_csv", "abl_md")


def stage_variant(cfg: StudyConfig, variant: str, stage: str) -> str:
    """The infrastructure a stage of a `variant` cell runs on: the bugs hit only the stages in `bug_stages`
    (default: SFT, where the published baselines were damaged: LUFFY's SFT baseline ran OpenRLHF + DeepSpeed,
    see docs/sources.md, Study A); other stages run `fixed`."""
    return variant if stage in cfg.bug_stages else "fixed"


def rl_run_variant(cfg: StudyConfig, method: str, variant: str) -> str:
    """Run directory variant of an RL-stage method's (method, variant) cell: shared with `fixed` when no stage
    of it runs on buggy infrastructure under this variant."""
    if method == "sft_then_rl" and stage_variant(cfg, variant, "sft") != "fixed":
        return variant
    return stage_variant(cfg, variant, "rl")


def base_seed(cfg: StudyConfig, seed: int | str) -> int:
    """The pretraining seed of the base model a seed starts from: base_seeds[seed mod len(base_seeds)], so the
    seeds alternate between the bases and any n splits them evenly (round 6, issue 59: the base is one draw of its
    own, a random effect, not a constant)."""
    return cfg.base_seeds[int(seed) % len(cfg.base_seeds)]


def base_dir(root: str, model: str, base: int | str) -> str:
    """The base model pretrained with seed `base` (`base_seed`)."""
    return f"{root}/{model}/base/seed{base}"


def seed_base_dir(cfg: StudyConfig, root: str, model: str, seed: int | str) -> str:
    """The base model an evaluation or selection seed starts from."""
    return base_dir(root, model, base_seed(cfg, seed))


def run_dir(root: str, model: str, variant: str, method: str, seed: int | str) -> str:
    return f"{root}/{model}/{variant}/{method}/seed{seed}"


def grid_dir(root: str, model: str, method: str, lr: str, seed: int | str) -> str:
    """An LR-selection run: `method` at learning rate `lr` (lr_select.lr_name) on the selection seed."""
    return f"{root}/{model}/lr_grid/{method}/lr{lr}/seed{seed}"


SELECTION = "lr_selection.json"          # under the results root: every arm's chosen LR (lr_select.py)
LR_ROUND = "lr_rounds/round{round}.json"  # under the results root: the LR grid's rounds


def selection_path(root: str) -> str:
    return f"{root}/{SELECTION}"


def tuned_methods(cfg: StudyConfig) -> list[str]:
    """The RL-stage arms whose LR the selection chooses: every configured RL-stage method (the truncated SFT-then-RL
    is the sft_then_rl run read early, so it needs sft_then_rl's)."""
    wanted = set(cfg.methods) | ({"sft_then_rl"} if "sft_then_rl_truncated" in cfg.methods else set())
    return [m for m in RL_STAGE if m in wanted]


def grid_runs(cfg: StudyConfig, root: str, points: list[dict] | None = None) -> list[str]:
    """metrics.json of the LR-selection runs: the configured grid (every model x tuned method x lr), or the
    `points` an extension round lists ({"model", "method", "lr"})."""
    from gradfidelity.studies.sft_rl.lr_select import lr_name

    sel = cfg.lr_selection
    if points is None:
        points = [{"model": m.name, "method": meth, "lr": lr} for m in cfg.models for meth in tuned_methods(cfg)
                  for lr in sel.lrs]
    return [f"{grid_dir(root, p['model'], p['method'], lr_name(p['lr']), sel.seed)}/metrics.json" for p in points]


def grid_init_dir(cfg: StudyConfig, root: str, model: str, method: str) -> str:
    """Where an LR-selection run starts: as the arm does, on the selection seed (SFT-then-RL from the fixed SFT run of
    the selection seed, every other arm from the base model)."""
    if method == "sft_then_rl":
        return run_dir(root, model, "fixed", "sft", cfg.lr_selection.seed)
    return seed_base_dir(cfg, root, model, cfg.lr_selection.seed)


def alignment_dir(root: str, model: str) -> str:
    return f"{root}/{model}/alignment/seed0"


def alignment_metrics(cfg: StudyConfig, root: str) -> str:
    """metrics.json of the alignment run ds_audit's A3 reads (the first model's), `root` = results/<scale>/sft_rl."""
    return f"{alignment_dir(root, cfg.models[0].name)}/metrics.json"


def init_dir(cfg: StudyConfig, root: str, model: str, variant: str, method: str, seed: int | str) -> str:
    """Where an RL-stage run starts: the base model, or (sft_then_rl) the SFT run of the same seed."""
    if method == "sft_then_rl":
        return run_dir(root, model, stage_variant(cfg, variant, "sft"), "sft", seed)
    return seed_base_dir(cfg, root, model, seed)


def cell_run(cfg: StudyConfig, variant: str, method: str) -> tuple[str, str]:
    """The (variant, method) of the run a table cell (variant x method) reads: the truncated SFT-then-RL reads
    the sft_then_rl run, and a cell none of whose stages runs on buggy infrastructure reads the fixed run."""
    if method == "sft":
        return stage_variant(cfg, variant, "sft"), "sft"
    if method == "sft_then_rl_truncated":
        method = "sft_then_rl"
    return rl_run_variant(cfg, method, variant), method


SFT_START = "sft_start"  # the table row of SFT-then-RL's start: the SFT run at its start step (sft.start_every)


def start_method(method: str) -> str:
    """The table row an arm starts from (same variant and seed): SFT-then-RL (and its truncation) from its SFT run's
    start (SFT_START: the SFT run's end where sft.start_every is 0), every other arm (SFT, plain RL, the mixed-policy
    methods) from the seed's base model (aggregate.BASE)."""
    return SFT_START if method in ("sft_then_rl", "sft_then_rl_truncated") else "base"


def cell_dir(cfg: StudyConfig, root: str, model: str, variant: str, method: str, seed: int) -> str:
    """The run directory a table cell (method x variant) reads."""
    return run_dir(root, model, *cell_run(cfg, variant, method), seed)


def table_cells(cfg: StudyConfig) -> list[tuple[str, str]]:
    """Every (variant, method) cell of the tables: each table variant x method, plus SFT on every other variant
    (the bug ablation)."""
    cells = [(v, m) for v in table_variants(cfg) for m in cfg.methods]
    if "sft" in cfg.methods:
        cells += [(v, "sft") for v in cfg.variants if v not in TABLE_VARIANTS]
    return cells


def table_variants(cfg: StudyConfig) -> list[str]:
    return [v for v in TABLE_VARIANTS if v in cfg.variants]


def planned_runs(cfg: StudyConfig, root: str) -> list[str]:
    """metrics.json of every training run the config asks for (the aggregate rule's inputs)."""
    runs: set[str] = set()
    methods = cfg.methods
    for model in (m.name for m in cfg.models):
        for seed in cfg.seeds:
            if "sft" in methods:  # the bug ablation: SFT on every variant
                for v in cfg.variants:
                    runs.add(run_dir(root, model, stage_variant(cfg, v, "sft"), "sft", seed))
            for v in table_variants(cfg):
                for method in methods:
                    if method in RL_STAGE or method == "sft_then_rl_truncated":
                        runs.add(cell_dir(cfg, root, model, v, method, seed))
    return sorted(f"{r}/metrics.json" for r in runs)


def used_bases(cfg: StudyConfig) -> list[int]:
    """The base seeds some evaluation seed or the LR selection's seed starts from (sorted)."""
    seeds = list(cfg.seeds) + ([cfg.lr_selection.seed] if cfg.lr_selection is not None and cfg.lr_selection.enabled
                               else [])
    return sorted({base_seed(cfg, s) for s in seeds})


def base_runs(cfg: StudyConfig, root: str) -> list[str]:
    """metrics.json of every base model some seed starts from (per model and base seed)."""
    return [f"{base_dir(root, m.name, b)}/metrics.json" for m in cfg.models for b in used_bases(cfg)]


def bench_init_dir(cfg: StudyConfig, root: str) -> str:
    """The SFT run the throughput bench (bench.py) trains from: the fixed SFT of the selection seed (where every
    SFT-then-RL grid run starts), or of the first seed when the config selects no LR."""
    sel = cfg.lr_selection
    seed = sel.seed if sel is not None and sel.enabled else cfg.seeds[0]
    return run_dir(root, cfg.models[0].name, "fixed", "sft", seed)


def table_paths(tables: str) -> dict[str, str]:
    """The study's paper tables under `tables` (paper_tables/<scale>), keyed like the CLI's arguments."""
    return {"main_csv": f"{tables}/sft_rl_main.csv", "main_md": f"{tables}/sft_rl_main.md",
            "abl_csv": f"{tables}/sft_rl_bug_ablation.csv", "abl_md": f"{tables}/sft_rl_bug_ablation.md"}


def starts_paths(tables: str) -> dict[str, str]:
    """SFT-then-RL's start per seed (tables.starts_table) under `tables`."""
    return {"csv": f"{tables}/sft_rl_starts.csv", "md": f"{tables}/sft_rl_starts.md"}


def selection_table_paths(tables: str) -> dict[str, str]:
    """The LR selection's table (lr_select.write_selection) under `tables`."""
    return {"csv": f"{tables}/sft_rl_lr_selection.csv", "md": f"{tables}/sft_rl_lr_selection.md"}


def compare_paths(tables: str, rl_steps: int) -> dict[str, str]:
    """The comparison with earlier records at an RL budget of `rl_steps` steps (earlier.py) under `tables`."""
    return {"csv": f"{tables}/sft_rl_step{rl_steps}.csv", "md": f"{tables}/sft_rl_step{rl_steps}.md"}


def earlier_records(folder: str) -> list[str]:
    """Every run's metrics.json under `folder` (replays left out), sorted; a loud error when there is none."""
    found = sorted(str(p) for p in Path(folder).rglob("metrics.json") if "replay" not in p.parts)
    if not found:
        raise UserError(f"sft_rl.compare_with.records: no metrics.json under {folder}")
    return found


def figure_paths(figures: str) -> dict[str, str]:
    """The study's figures under `figures` (figures/<scale>), keyed like the CLI's arguments."""
    return {"score_vs_flops": f"{figures}/sft_rl_score_vs_flops.png",
            "reward_curves": f"{figures}/sft_rl_reward_curves.png"}
