# Study B (async_pp, arXiv 2606.30634): one-step gradient delay across optimizers, mitigations, PipeDream depth,
# training length; plus the real-pipeline benchmark. Cells come from gradfidelity.studies.async_pp.plan
# (torch-free); every cell has its own run directory, the wildcards of the one training rule:
#   results/<scale>/async_pp/optimizer~<o>/lr~<tuned|x<m>>/head~<h>/schedule~<s>/mitigation~<m>/depth~<P>/
#   momentum~<mu>/steps~<n>/seed<k>/metrics.json
# Order: the LR grid (every arm: sync, 2bw, PipeDream per depth; lr~x<m>, selection seed) -> lr_selection.json ->
# every lr~tuned cell (sync's choice) and lr~own cell (its own schedule's choice) reads its LR there.
# Each rule passes only the config sections its jobs read (gradfidelity.studies.async_pp.rules.JOB_KEYS: an edit of
# `bench` reruns the benchmark only, one of `delay` only the cells with a mitigation that reads it).
import gradfidelity.studies.async_pp.plan as _ap_plan
import gradfidelity.studies.async_pp.rules as _ap_rules

ASYNC_PP_CFG = config["async_pp"]  # the validated section: each job's --cfg is cut from it (rules.job_cfg)
ASYNC_PP = STUDY_CONFIG["async_pp"]  # typed and cross-checked (common.smk): the plan is made from it
ASYNC_PP_ROOT = f"{RESULTS}/async_pp"
ASYNC_PP_RUNS = _ap_rules.study_runs(ASYNC_PP, ASYNC_PP_ROOT, checkpoints)  # the plan + the LR grid's extensions
ASYNC_PP_SELECTION = f"{ASYNC_PP_ROOT}/{_ap_plan.SELECTION}"
ASYNC_PP_DATA = _ap_rules.data_files(ASYNC_PP, ASYNC_PP_ROOT)  # {} unless data.corpus is file
ASYNC_PP_TABLES = _ap_plan.table_paths(TABLES)
ASYNC_PP_FIGURES = _ap_plan.figure_paths(FIGURES)
ASYNC_PP_DRIFT = sorted(str(p) for p in Path(RESULTS, "reference").glob("drift_*.csv"))
# Rounds 4-5's evaluation records, archived by round 6 (its README): one table reads them, the drift between host
# types per arm (issue 60), pairing each with the current run of the same cell, seed and LR value.
ASYNC_PP_ARCHIVE = f"{RESULTS}/archive/async_pp_round5"
ASYNC_PP_ARCHIVED = sorted(str(p) for p in Path(ASYNC_PP_ARCHIVE).glob("optimizer~*/**/metrics.json"))
ASYNC_PP_HOST_DRIFT = (
    [f"{TABLES}/async_pp_host_drift.csv", f"{TABLES}/async_pp_host_drift.md"] if ASYNC_PP_ARCHIVED else []
)

STUDY_RUNS["async_pp"] = ASYNC_PP_RUNS
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/async_pp.json")
REPORT_TARGETS.extend(ASYNC_PP_TABLES + ASYNC_PP_FIGURES + ASYNC_PP_HOST_DRIFT + [f"{RESULTS}/bench/async_pp.json"])


# A text file (config data.path; at the cpu scale `local:python_docs`, the Debian Python docs study C exports) -> the BPE
# trained on its training blocks and both splits as token ids, with the sizes and MD5s every run checks. Only the
# cells and the bench of a `file` corpus ask for it.
rule async_pp_data:
    input:
        study_file(ASYNC_PP.data.path),
    output:
        **_ap_rules.data_files(ASYNC_PP, ASYNC_PP_ROOT, always=True),
    params:
        cfg=_ap_rules.job_cfg(ASYNC_PP_CFG, "data"),
        gf=GF,
    log:
        f"{ASYNC_PP_ROOT}/logs/data.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_data"),
    shell:
        "{params.gf} async-pp-data --cfg {params.cfg} --corpus {input} --out $(dirname {output.meta}) > {log} 2>&1"


# What each training cell's record stands for (harness/identity.py): its `--cfg`, its text and its LR's selection.
ASYNC_PP_IDENTITY = job_identity(
    "async_pp", lambda w: _ap_rules.train_job(w.mitigation), _ap_rules.train_cfg(ASYNC_PP_CFG),
    _ap_rules.train_identity(ASYNC_PP, ASYNC_PP_CFG,
                             study_file_md5(ASYNC_PP.data.path) if ASYNC_PP.data.corpus == "file" else None))


rule async_pp_train:
    input:
        unpack(unless_committed("async_pp_train", f"{ASYNC_PP_ROOT}/{_ap_plan.PATTERN}",
                                _ap_rules.train_input(given_lr_selection(ASYNC_PP_SELECTION), ASYNC_PP_DATA),
                                identity=ASYNC_PP_IDENTITY)),
    output:
        f"{ASYNC_PP_ROOT}/{_ap_plan.PATTERN}",
    wildcard_constraints:
        **_ap_rules.WILDCARDS,
    params:
        cfg=_ap_rules.train_cfg(ASYNC_PP_CFG),
        run_dir=_ap_rules.run_dir,
        cell=cell_json,
        lr=_ap_rules.lr_arg,
        data=_ap_rules.data_arg,
        gf=GF,
        threads=_ap_rules.threads(ASYNC_PP),
        identity=identity_env(ASYNC_PP_IDENTITY),
    log:
        f"{ASYNC_PP_ROOT}/logs/{_ap_plan.RUN_DIR}.log",
    benchmark:
        f"{ASYNC_PP_ROOT}/{_ap_plan.RUN_DIR}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: _ap_rules.threads(ASYNC_PP)
    resources:
        **rule_resources("async_pp_train"),
    shell:
        "{params.identity}{params.gf} async-pp-train --cfg {params.cfg} --run-dir {params.run_dir} --cell {params.cell} {params.lr} "
        "{params.data} --threads {params.threads} > {log} 2>&1"


# The same rule on the width ladder (sweeps.width, issue 60): its cells live under `width~<d_model>/`, so the model's
# own width keeps every earlier record where it was.
use rule async_pp_train as async_pp_train_width with:
    input:
        unpack(unless_committed("async_pp_train_width", f"{ASYNC_PP_ROOT}/{_ap_plan.WIDTH_PREFIX}{_ap_plan.PATTERN}",
                                _ap_rules.train_input(given_lr_selection(ASYNC_PP_SELECTION), ASYNC_PP_DATA),
                                identity=ASYNC_PP_IDENTITY)),
    output:
        f"{ASYNC_PP_ROOT}/{_ap_plan.WIDTH_PREFIX}{_ap_plan.PATTERN}",
    log:
        f"{ASYNC_PP_ROOT}/logs/{_ap_plan.WIDTH_PREFIX}{_ap_plan.RUN_DIR}.log",
    benchmark:
        f"{ASYNC_PP_ROOT}/{_ap_plan.WIDTH_PREFIX}{_ap_plan.RUN_DIR}/benchmark.tsv"
    resources:
        **rule_resources("async_pp_train_width"),


# The LR grid in rounds: round k reads the grid runs so far and lists the points round k+1 adds (2x past a winning
# edge); Snakemake re-evaluates the DAG after each round (a checkpoint), and the selection waits for the first
# round that adds nothing (lr_select.py).
checkpoint async_pp_lr_round:
    input:
        # a committed round's document stands like a committed record (sft_rl.smk, sft_rl_lr_round)
        unless_committed("async_pp_lr_round", f"{ASYNC_PP_ROOT}/{_ap_rules.LR_ROUND}",
                         _ap_rules.lr_round_input(ASYNC_PP, ASYNC_PP_ROOT, checkpoints)),
    output:
        f"{ASYNC_PP_ROOT}/{_ap_rules.LR_ROUND}",
    wildcard_constraints:
        round=r"\d+",
    params:
        gf=GF,
        scale=SCALE,
        base=" ".join(f"{m:g}" for m in ASYNC_PP.lr_selection.multipliers),
        max_extensions=ASYNC_PP.lr_selection.max_extensions,
    log:
        f"{ASYNC_PP_ROOT}/logs/lr_round{{round}}.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_lr_round"),
    shell:
        "{params.gf} async-pp-lr-round --metrics {input} --scale {params.scale} --base {params.base} "
        "--max-extensions {params.max_extensions} --out {output} > {log} 2>&1"


rule async_pp_select_lr:
    input:
        _ap_rules.lr_grid_input(ASYNC_PP, ASYNC_PP_ROOT, checkpoints),
    output:
        selection=ASYNC_PP_SELECTION,
    params:
        gf=GF,
        scale=SCALE,
        base=" ".join(f"{m:g}" for m in ASYNC_PP.lr_selection.multipliers),
        near_tie=_ap_rules.near_tie_arg(ASYNC_PP),
    log:
        f"{RESULTS}/async_pp/logs/select_lr.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_select_lr"),
    shell:
        "{params.gf} async-pp-select-lr --metrics {input} --scale {params.scale} --base {params.base} "
        "--near-tie-sd {params.near_tie} --out {output.selection} > {log} 2>&1"


# The selection's table, with each sync and 2bw choice checked at a longer budget (lr_selection.check_steps, issue
# 60): the chosen multiplier and its neighbours, planned from the last LR round's choices.
rule async_pp_lr_table:
    input:
        selection=ASYNC_PP_SELECTION,
        check=_ap_rules.lr_check_input(ASYNC_PP, ASYNC_PP_ROOT, checkpoints),
    output:
        table=f"{TABLES}/async_pp_lr_selection.csv",
        table_md=report(f"{TABLES}/async_pp_lr_selection.md", category="async_pp"),
    params:
        gf=GF,
        scale=SCALE,
        check_steps=(f"--check-steps {ASYNC_PP.lr_selection.check_steps}"
                     if ASYNC_PP.lr_selection.check_steps is not None else "")
        + (" --check-optimizers " + " ".join(ASYNC_PP.lr_selection.check_optimizers)
           if ASYNC_PP.lr_selection.check_optimizers else ""),
    log:
        f"{RESULTS}/async_pp/logs/lr_table.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_select_lr"),
    shell:
        "{params.gf} async-pp-lr-table --selection {input.selection} --scale {params.scale} {params.check_steps} "
        "--check-metrics {input.check} --table {output.table} > {log} 2>&1"


rule async_pp_aggregate:
    input:
        ASYNC_PP_RUNS,
    output:
        runs=f"{RESULTS}/async_pp/runs.csv",
        curves=f"{RESULTS}/async_pp/curves.csv",
    params:
        gf=GF,
        scale=SCALE,
        tokens=_ap_rules.tokens_per_step(ASYNC_PP),
    log:
        f"{RESULTS}/async_pp/logs/aggregate.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_aggregate"),
    shell:
        "{params.gf} async-pp-aggregate --metrics {input} --scale {params.scale} --tokens-per-step {params.tokens} "
        "--runs {output.runs} --curves {output.curves} > {log} 2>&1"


rule async_pp_tables:
    input:
        runs=f"{RESULTS}/async_pp/runs.csv",
    output:
        main=f"{TABLES}/async_pp_main.csv",
        main_md=report(f"{TABLES}/async_pp_main.md", category="async_pp"),
        mitigations=f"{TABLES}/async_pp_mitigations.csv",
        mitigations_md=report(f"{TABLES}/async_pp_mitigations.md", category="async_pp"),
        length=f"{TABLES}/async_pp_length.csv",
        length_md=report(f"{TABLES}/async_pp_length.md", category="async_pp"),
        momentum=f"{TABLES}/async_pp_momentum.csv",
        momentum_md=report(f"{TABLES}/async_pp_momentum.md", category="async_pp"),
        width=f"{TABLES}/async_pp_width.csv",
        width_md=report(f"{TABLES}/async_pp_width.md", category="async_pp"),
    params:
        cfg=_ap_rules.job_cfg(ASYNC_PP_CFG, "tables"),
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/async_pp/logs/tables.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_tables"),
    shell:
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} "
        "--scale {params.scale} --main-table {output.main} --mitigations-table {output.mitigations} "
        "--length-table {output.length} --momentum-table {output.momentum} --width-table {output.width} > {log} 2>&1"


rule async_pp_figures:
    input:
        runs=f"{RESULTS}/async_pp/runs.csv",
        curves=f"{RESULTS}/async_pp/curves.csv",
    output:
        momentum=report(f"{FIGURES}/async_pp_momentum.png", category="async_pp"),
        depth=report(f"{FIGURES}/async_pp_depth.png", category="async_pp"),
        ladder=report(f"{FIGURES}/async_pp_ladder.png", category="async_pp"),
        curves=report(f"{FIGURES}/async_pp_curves.png", category="async_pp"),
        width=report(f"{FIGURES}/async_pp_width.png", category="async_pp"),
    params:
        cfg=_ap_rules.job_cfg(ASYNC_PP_CFG, "figures"),
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/async_pp/logs/figures.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_figures"),
    shell:
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --curves {input.curves} --scale {params.scale} "
        "--fig-momentum {output.momentum} --fig-depth {output.depth} --fig-ladder {output.ladder} "
        "--fig-curves {output.curves} --fig-width {output.width} > {log} 2>&1"


rule async_pp_claims:
    input:
        runs=f"{RESULTS}/async_pp/runs.csv",
        main=f"{TABLES}/async_pp_main.csv",
        mitigations=f"{TABLES}/async_pp_mitigations.csv",
        lr_selection=f"{TABLES}/async_pp_lr_selection.csv",
        length=f"{TABLES}/async_pp_length.csv",
        momentum=f"{TABLES}/async_pp_momentum.csv",
        # the drift measured between host types (check-reference --measure-drift), beside a contrast of two
        drift=ASYNC_PP_DRIFT,
    output:
        claims=f"{RESULTS}/claims/async_pp.json",
        budget=f"{TABLES}/async_pp_budget_rule.csv",
        budget_md=report(f"{TABLES}/async_pp_budget_rule.md", category="async_pp"),
        near_tie=f"{TABLES}/async_pp_near_tie.csv",
        near_tie_md=report(f"{TABLES}/async_pp_near_tie.md", category="async_pp"),
    params:
        cfg=_ap_rules.job_cfg(ASYNC_PP_CFG, "claims"),
        gf=GF,
        scale=SCALE,
        drift=_ap_rules.claim_sources(ASYNC_PP_DRIFT),
    log:
        f"{RESULTS}/async_pp/logs/claims.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_claims"),
    shell:
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --scale {params.scale} "
        "--claims {output.claims} --budget-table {output.budget} --near-tie-table {output.near_tie} "
        "--lr-selection-table {input.lr_selection} "
        "--claim-source {input.main} --claim-source {input.mitigations} --claim-source {input.lr_selection} "
        "--claim-source {input.length} --claim-source {input.momentum} {params.drift} "
        "> {log} 2>&1"


rule async_pp_bench:
    input:
        unless_committed("async_pp_bench", f"{RESULTS}/bench/async_pp.json", list(ASYNC_PP_DATA.values())),
    output:
        report(f"{RESULTS}/bench/async_pp.json", category="async_pp"),
    params:
        cfg=_ap_rules.job_cfg(ASYNC_PP_CFG, "bench"),
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/async_pp/logs/bench.log",
    benchmark:
        f"{RESULTS}/async_pp/benchmarks/bench.tsv"
    conda:
        CONDA_ENV
    threads: 2
    resources:
        **rule_resources("async_pp_bench"),
    shell:
        "{params.gf} bench-async-pp --cfg {params.cfg} --out {output} "
        + (f"--data {ASYNC_PP_ROOT}/data " if ASYNC_PP_DATA else "")
        + "> {log} 2>&1"


if ASYNC_PP_ARCHIVED:

    rule async_pp_archive_runs:
        input:
            ASYNC_PP_ARCHIVED,
        output:
            runs=f"{ASYNC_PP_ARCHIVE}/runs.csv",
            curves=temp(f"{ASYNC_PP_ARCHIVE}/curves.csv"),
        params:
            gf=GF,
            scale=SCALE,
        log:
            f"{RESULTS}/async_pp/logs/archive_runs.log",
        conda:
            CONDA_ENV
        threads: 1
        resources:
            **rule_resources("async_pp_archive_runs"),
        shell:
            "{params.gf} async-pp-aggregate --metrics {input} --scale {params.scale} --runs {output.runs} "
            "--curves {output.curves} > {log} 2>&1"

    rule async_pp_host_drift:
        input:
            runs=f"{RESULTS}/async_pp/runs.csv",
            archive=f"{ASYNC_PP_ARCHIVE}/runs.csv",
        output:
            csv=ASYNC_PP_HOST_DRIFT[0],
            md=report(ASYNC_PP_HOST_DRIFT[1], category="async_pp"),
        params:
            cfg=_ap_rules.job_cfg(ASYNC_PP_CFG, "host_drift"),
            gf=GF,
            scale=SCALE,
        log:
            f"{RESULTS}/async_pp/logs/host_drift.log",
        conda:
            CONDA_ENV
        threads: 1
        resources:
            **rule_resources("async_pp_host_drift"),
        shell:
            "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --scale {params.scale} "
            "--archive-runs {input.archive} --host-drift-table {output.csv} > {log} 2>&1"


rule async_pp:
    input:
        ASYNC_PP_TABLES,
        ASYNC_PP_FIGURES,
        ASYNC_PP_HOST_DRIFT,
        f"{RESULTS}/claims/async_pp.json",
        f"{RESULTS}/bench/async_pp.json",
