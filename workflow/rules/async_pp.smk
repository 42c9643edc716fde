# Study B (async_pp, arXiv 2606.30634): one-step gradient delay across optimizers, mitigations, PipeDream depth,
# training length; plus the real-pipeline benchmark. Cells come from gradfidelity.studies.async_pp.plan
# (torch-free); every cell has its own run directory, the wildcards of the one training rule:
#   results/<scale>/async_pp/optimizer~<o>/lr~<tuned|x<m>>/head~<h>/schedule~<s>/mitigation~<m>/depth~<P>/
#   momentum~<mu>/steps~<n>/seed<k>/metrics.json
# Order: the LR grid (sync, lr~x<m>, selection seed) -> lr_selection.json -> every lr~tuned cell reads its LR there.
# Each rule passes only the config sections its jobs read (gradfidelity.studies.async_pp.rules.JOB_KEYS: an edit of
# `bench` reruns the benchmark only, one of `delay` only the cells with a mitigation that reads it).
import gradfidelity.studies.async_pp.plan as _ap_plan
import gradfidelity.studies.async_pp.rules as _ap_rules

ASYNC_PP_CFG = config["async_pp"]  # the validated section: each job's --cfg is cut from it (rules.job_cfg)
ASYNC_PP = STUDY_CONFIG["async_pp"]  # typed and cross-checked (common.smk): the plan is made from it
ASYNC_PP_ROOT = f"{RESULTS}/async_pp"
ASYNC_PP_GRID = _ap_plan.grid_metrics(ASYNC_PP, ASYNC_PP_ROOT)
ASYNC_PP_METRICS = _ap_plan.metrics(ASYNC_PP, ASYNC_PP_ROOT)
ASYNC_PP_SELECTION = f"{ASYNC_PP_ROOT}/{_ap_plan.SELECTION}"
ASYNC_PP_TABLES = _ap_plan.table_paths(TABLES)
ASYNC_PP_FIGURES = _ap_plan.figure_paths(FIGURES)

STUDY_RUNS["async_pp"] = ASYNC_PP_METRICS
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/async_pp.json")
REPORT_TARGETS.extend(ASYNC_PP_TABLES + ASYNC_PP_FIGURES + [f"{RESULTS}/bench/async_pp.json"])


rule async_pp_train:
    input:
        _ap_rules.train_input(ASYNC_PP_SELECTION),
    output:
        f"{ASYNC_PP_ROOT}/{_ap_plan.PATTERN}",
    wildcard_constraints:
        **_ap_rules.WILDCARDS,
    params:
        cfg=_ap_rules.train_cfg(ASYNC_PP_CFG),
        run_dir=_ap_rules.run_dir,
        cell=cell_json,
        lr=_ap_rules.lr_arg,
        gf=GF,
        threads=_ap_rules.threads(ASYNC_PP),
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
        "{params.gf} async-pp-train --cfg {params.cfg} --run-dir {params.run_dir} --cell {params.cell} {params.lr} "
        "--threads {params.threads} > {log} 2>&1"


rule async_pp_select_lr:
    input:
        ASYNC_PP_GRID,
    output:
        selection=ASYNC_PP_SELECTION,
        table=f"{TABLES}/async_pp_lr_selection.csv",
        table_md=report(f"{TABLES}/async_pp_lr_selection.md", category="async_pp"),
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/async_pp/logs/select_lr.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_select_lr"),
    shell:
        "{params.gf} async-pp-select-lr --metrics {input} --scale {params.scale} --out {output.selection} "
        "--table {output.table} > {log} 2>&1"


rule async_pp_aggregate:
    input:
        ASYNC_PP_METRICS,
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
        curves=f"{RESULTS}/async_pp/curves.csv",
    output:
        main=f"{TABLES}/async_pp_main.csv",
        main_md=report(f"{TABLES}/async_pp_main.md", category="async_pp"),
        mitigations=f"{TABLES}/async_pp_mitigations.csv",
        mitigations_md=report(f"{TABLES}/async_pp_mitigations.md", category="async_pp"),
        length=f"{TABLES}/async_pp_length.csv",
        length_md=report(f"{TABLES}/async_pp_length.md", category="async_pp"),
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
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --curves {input.curves} "
        "--scale {params.scale} --main-table {output.main} --mitigations-table {output.mitigations} "
        "--length-table {output.length} > {log} 2>&1"


rule async_pp_figures:
    input:
        runs=f"{RESULTS}/async_pp/runs.csv",
        curves=f"{RESULTS}/async_pp/curves.csv",
    output:
        momentum=report(f"{FIGURES}/async_pp_momentum.png", category="async_pp"),
        depth=report(f"{FIGURES}/async_pp_depth.png", category="async_pp"),
        gap_vs_tokens=report(f"{FIGURES}/async_pp_gap_vs_tokens.png", category="async_pp"),
        curves=report(f"{FIGURES}/async_pp_curves.png", category="async_pp"),
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
        "--fig-momentum {output.momentum} --fig-depth {output.depth} --fig-gap-vs-tokens {output.gap_vs_tokens} "
        "--fig-curves {output.curves} > {log} 2>&1"


rule async_pp_claims:
    input:
        runs=f"{RESULTS}/async_pp/runs.csv",
        main=f"{TABLES}/async_pp_main.csv",
        mitigations=f"{TABLES}/async_pp_mitigations.csv",
        lr_selection=f"{TABLES}/async_pp_lr_selection.csv",
        length=f"{TABLES}/async_pp_length.csv",
    output:
        f"{RESULTS}/claims/async_pp.json",
    params:
        cfg=_ap_rules.job_cfg(ASYNC_PP_CFG, "claims"),
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/async_pp/logs/claims.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("async_pp_claims"),
    shell:
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --scale {params.scale} --claims {output} "
        "--claim-source {input.main} --claim-source {input.mitigations} --claim-source {input.lr_selection} "
        "--claim-source {input.length} "
        "> {log} 2>&1"


rule async_pp_bench:
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
        "{params.gf} bench-async-pp --cfg {params.cfg} --out {output} > {log} 2>&1"


rule async_pp:
    input:
        ASYNC_PP_TABLES,
        ASYNC_PP_FIGURES,
        f"{RESULTS}/claims/async_pp.json",
        f"{RESULTS}/bench/async_pp.json",
