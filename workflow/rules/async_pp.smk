# Study B (async_pp, arXiv 2606.30634): one-step gradient delay across optimizers, mitigations, PipeDream depth,
# training length; plus the real-pipeline benchmark. Cells come from gradfidelity.studies.async_pp.plan
# (torch-free); every cell has its own run directory, the wildcards of the one training rule:
#   results/<scale>/async_pp/optimizer~<o>/lr~<tuned|x<m>>/head~<h>/schedule~<s>/mitigation~<m>/depth~<P>/
#   momentum~<mu>/steps~<n>/seed<k>/metrics.json
# Order: the LR grid (sync, lr~x<m>, selection seed) -> lr_selection.json -> every lr~tuned cell reads its LR there.
# Each rule passes only the config sub-sections its jobs depend on (an edit of `bench` reruns the benchmark only,
# one of `delay` only the cells with a mitigation that reads it).
from gradfidelity.studies.async_pp.plan import PATTERN as _AP_PATTERN
from gradfidelity.studies.async_pp.plan import RUN_DIR as _AP_RUN_DIR
from gradfidelity.studies.async_pp.plan import WILDCARDS as _AP_WILDCARDS
from gradfidelity.studies.async_pp.plan import cells as _ap_cells
from gradfidelity.studies.async_pp.plan import grid_cells as _ap_grid_cells
from gradfidelity.studies.async_pp.rules import lr_arg as _ap_lr_arg
from gradfidelity.studies.async_pp.rules import sections as _ap_sections
from gradfidelity.studies.async_pp.rules import train_cfg as _ap_train_cfg
from gradfidelity.studies.async_pp.rules import train_input as _ap_train_input

ASYNC_PP_CFG = config["async_pp"]
ASYNC_PP_ROOT = f"{RESULTS}/async_pp"
ASYNC_PP_GRID = [c.metrics(ASYNC_PP_ROOT) for c in _ap_grid_cells(ASYNC_PP_CFG)]
ASYNC_PP_METRICS = [c.metrics(ASYNC_PP_ROOT) for c in _ap_cells(ASYNC_PP_CFG)]
ASYNC_PP_SELECTION = f"{ASYNC_PP_ROOT}/lr_selection.json"
ASYNC_PP_TABLES = [f"{TABLES}/async_pp_main.csv", f"{TABLES}/async_pp_main.md",
                   f"{TABLES}/async_pp_mitigations.csv", f"{TABLES}/async_pp_mitigations.md",
                   f"{TABLES}/async_pp_lr_selection.csv", f"{TABLES}/async_pp_lr_selection.md",
                   f"{TABLES}/async_pp_length.csv", f"{TABLES}/async_pp_length.md"]
ASYNC_PP_FIGURES = [f"{FIGURES}/async_pp_momentum.png", f"{FIGURES}/async_pp_depth.png",
                    f"{FIGURES}/async_pp_gap_vs_tokens.png", f"{FIGURES}/async_pp_curves.png"]
# Minutes per training job (one cell); paper scale trains for days per cell on accelerators.
ASYNC_PP_RUNTIME = {"smoke": 10, "cpu": 30, "paper": 10080}[SCALE]
ASYNC_PP_MEM = {"smoke": 2000, "cpu": 3000, "paper": 64000}[SCALE]
# GPUs per training job (read by the SLURM executor; ignored by local runs, which never request one).
ASYNC_PP_GPU = {"smoke": 0, "cpu": 0, "paper": 1}[SCALE]

STUDY_RUNS["async_pp"] = ASYNC_PP_METRICS
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/async_pp.json")
REPORT_TARGETS.extend(ASYNC_PP_TABLES + ASYNC_PP_FIGURES + [f"{RESULTS}/bench/async_pp.json"])


rule async_pp_train:
    input:
        _ap_train_input(ASYNC_PP_SELECTION),
    output:
        f"{ASYNC_PP_ROOT}/{_AP_PATTERN}",
    wildcard_constraints:
        **_AP_WILDCARDS,
    params:
        cfg=_ap_train_cfg(ASYNC_PP_CFG),
        lr=_ap_lr_arg,
        gf=GF,
        threads=ASYNC_PP_CFG["threads_per_run"],
    log:
        f"{ASYNC_PP_ROOT}/logs/{_AP_RUN_DIR}.log",
    benchmark:
        f"{ASYNC_PP_ROOT}/{_AP_RUN_DIR}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: ASYNC_PP_CFG["threads_per_run"]
    resources:
        **cluster_resources("async_pp_train", mem_mb=ASYNC_PP_MEM, runtime=ASYNC_PP_RUNTIME, gpu=ASYNC_PP_GPU),
    shell:
        "{params.gf} async-pp-train --cfg {params.cfg} --metrics {output} {params.lr} --threads {params.threads} "
        "> {log} 2>&1"


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
        mem_mb=1000,
        runtime=5,
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
        tokens=ASYNC_PP_CFG["train"]["batch_size"] * ASYNC_PP_CFG["train"]["seq_len"],
    log:
        f"{RESULTS}/async_pp/logs/aggregate.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
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
        cfg=_ap_sections(ASYNC_PP_CFG, "seeds", "model", "train", "sweeps"),
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
        cfg=_ap_sections(ASYNC_PP_CFG, "seeds", "model", "train", "sweeps"),
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
        main=f"{TABLES}/async_pp_main.csv",
        mitigations=f"{TABLES}/async_pp_mitigations.csv",
        lr_selection=f"{TABLES}/async_pp_lr_selection.csv",
        length=f"{TABLES}/async_pp_length.csv",
    output:
        f"{RESULTS}/claims/async_pp.json",
    params:
        cfg=_ap_sections(ASYNC_PP_CFG, "seeds", "model", "train", "sweeps"),
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
        "{params.gf} async-pp-report --cfg {params.cfg} --runs {input.runs} --scale {params.scale} --claims {output} "
        "--claim-source {input.main} --claim-source {input.mitigations} --claim-source {input.lr_selection} "
        "--claim-source {input.length} "
        "> {log} 2>&1"


rule async_pp_bench:
    output:
        report(f"{RESULTS}/bench/async_pp.json", category="async_pp"),
    params:
        cfg=_ap_sections(ASYNC_PP_CFG, "model", "data", "train", "bench"),
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
