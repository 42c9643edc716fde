# Study B (async_pp, arXiv 2606.30634): one-step gradient delay across optimizers, mitigations, PipeDream depth,
# training length; plus the real-pipeline benchmark. Cells and their grouping into jobs come from
# gradfidelity.studies.async_pp.plan (torch-free): every cell has its own run directory
#   results/<scale>/async_pp/optimizer~<o>/schedule~<s>/mitigation~<m>/depth~<P>/momentum~<mu>/steps~<n>/seed<k>/
# and one job trains `cells_per_job` cells of one optimizer and seed (start-up cost), so the train rules are
# generated per group below.
from gradfidelity.studies.async_pp.plan import cells as _ap_cells
from gradfidelity.studies.async_pp.plan import groups as _ap_groups

ASYNC_PP_CFG = config["async_pp"]
ASYNC_PP_ROOT = f"{RESULTS}/async_pp"
ASYNC_PP_GROUPS = _ap_groups(ASYNC_PP_CFG)
ASYNC_PP_METRICS = [c.metrics(ASYNC_PP_ROOT) for c in _ap_cells(ASYNC_PP_CFG)]
ASYNC_PP_TABLES = [f"{TABLES}/async_pp_main.csv", f"{TABLES}/async_pp_main.md",
                   f"{TABLES}/async_pp_mitigations.csv", f"{TABLES}/async_pp_mitigations.md"]
ASYNC_PP_FIGURES = [f"{FIGURES}/async_pp_momentum.png", f"{FIGURES}/async_pp_depth.png",
                    f"{FIGURES}/async_pp_gap_vs_tokens.png", f"{FIGURES}/async_pp_curves.png"]
# Paper scale trains for days per cell on accelerators; a job per cell there (cells_per_job: 1).
ASYNC_PP_RUNTIME = {"smoke": 10, "cpu": 600, "paper": 10080}[SCALE]
ASYNC_PP_MEM = {"smoke": 2000, "cpu": 6000, "paper": 64000}[SCALE]
# GPUs per training job (read by the SLURM executor; ignored by local runs, which never request one).
ASYNC_PP_GPU = {"smoke": 0, "cpu": 0, "paper": 1}[SCALE]

STUDY_RUNS["async_pp"] = ASYNC_PP_METRICS
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/async_pp.json")
REPORT_TARGETS.extend(ASYNC_PP_TABLES + ASYNC_PP_FIGURES + [f"{RESULTS}/bench/async_pp.json"])


for _g in ASYNC_PP_GROUPS:

    rule:
        name:
            f"async_pp_train_{_g.name}"
        output:
            [c.metrics(ASYNC_PP_ROOT) for c in _g.cells],
        params:
            cfg=study_cfg("async_pp"),
            cells=shlex.quote(_g.cells_json()),
            gf=GF,
            root=study_root("async_pp"),
        log:
            f"{ASYNC_PP_ROOT}/logs/train_{_g.name}.log",
        benchmark:
            f"{ASYNC_PP_ROOT}/benchmarks/train_{_g.name}.tsv"
        conda:
            CONDA_ENV
        threads: ASYNC_PP_CFG["threads_per_run"]
        resources:
            mem_mb=ASYNC_PP_MEM,
            runtime=ASYNC_PP_RUNTIME * len(_g.cells),
            gpu=ASYNC_PP_GPU,
        shell:
            "{params.gf} async-pp-train --cfg {params.cfg} --cells {params.cells} --root {params.root} > {log} 2>&1"


rule async_pp_aggregate:
    input:
        ASYNC_PP_METRICS,
    output:
        runs=f"{RESULTS}/async_pp/runs.csv",
        curves=f"{RESULTS}/async_pp/curves.csv",
    params:
        cfg=study_cfg("async_pp"),
        gf=GF,
        root=study_root("async_pp"),
    log:
        f"{RESULTS}/async_pp/logs/aggregate.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "{params.gf} async-pp-aggregate --cfg {params.cfg} --root {params.root} --runs {output.runs} "
        "--curves {output.curves} > {log} 2>&1"


rule async_pp_tables:
    input:
        runs=f"{RESULTS}/async_pp/runs.csv",
    output:
        main=report(f"{TABLES}/async_pp_main.csv", category="async_pp"),
        main_md=report(f"{TABLES}/async_pp_main.md", category="async_pp"),
        mitigations=report(f"{TABLES}/async_pp_mitigations.csv", category="async_pp"),
        mitigations_md=report(f"{TABLES}/async_pp_mitigations.md", category="async_pp"),
    params:
        cfg=study_cfg("async_pp"),
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/async_pp/logs/tables.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --scale {params.scale} "
        "--main-table {output.main} --mitigations-table {output.mitigations} > {log} 2>&1"


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
        cfg=study_cfg("async_pp"),
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/async_pp/logs/figures.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=1500,
        runtime=5,
    shell:
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --curves {input.curves} --scale {params.scale} "
        "--fig-momentum {output.momentum} --fig-depth {output.depth} --fig-gap-vs-tokens {output.gap_vs_tokens} "
        "--fig-curves {output.curves} > {log} 2>&1"


rule async_pp_claims:
    input:
        runs=f"{RESULTS}/async_pp/runs.csv",
    output:
        f"{RESULTS}/claims/async_pp.json",
    params:
        cfg=study_cfg("async_pp"),
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/async_pp/logs/claims.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --scale {params.scale} --claims {output} > {log} 2>&1"


rule async_pp_bench:
    output:
        report(f"{RESULTS}/bench/async_pp.json", category="async_pp"),
    params:
        cfg=study_cfg("async_pp"),
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
        mem_mb=3000,
        runtime=15,
    shell:
        "{params.gf} bench-async-pp --cfg {params.cfg} --out {output} > {log} 2>&1"


rule async_pp:
    input:
        ASYNC_PP_TABLES,
        ASYNC_PP_FIGURES,
        f"{RESULTS}/claims/async_pp.json",
        f"{RESULTS}/bench/async_pp.json",
