import glob

# The end of the DAG: every claim's verdict, computed from the studies' evidence files, and one runs table per
# study (seed, status, metrics, git sha, versions, CPU, threads of every run), committed with the cpu scale.
RUNS_TABLES = expand(f"{RESULTS}/runs/{{study}}.csv", study=STUDIES)
REPORT_SUMMARY = f"{RESULTS}/report/summary.rst"
# Verdicts recomputed under measured hardware drift (check-reference --measure-drift), committed with the cpu
# scale: the claims report flags a claim whose verdict flips there. None at a scale without them.
DRIFT_VERDICTS = sorted(glob.glob(f"{RESULTS}/reference/verdicts_*.csv"))
# The comparisons they were recomputed from: verify reads their run records to tell a measurement of today's runs
# from one of runs rerun since (claims/report.py, changed_runs).
DRIFT_SOURCES = sorted(set(glob.glob(f"{RESULTS}/reference/*.csv")) - set(DRIFT_VERDICTS))


rule runs_table:
    wildcard_constraints:
        study="|".join(STUDIES),
    input:
        study_runs,
    output:
        f"{RESULTS}/runs/{{study}}.csv",
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/logs/runs_{{study}}.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("runs_table"),
    shell:
        "{params.gf} runs-table --runs {input} --scale {params.scale} --out {output} > {log} 2>&1"


rule claims_figure:
    input:
        claims=f"{TABLES}/claims.csv",
    output:
        report(f"{FIGURES}/claims.png", category="Claims"),
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/logs/claims_figure.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("claims_figure"),
    shell:
        "{params.gf} claims-figure --claims {input.claims} --out {output} --scale {params.scale} > {log} 2>&1"


# The HTML report's landing page (the Snakefile's global `report:` points at it).
rule report_summary:
    input:
        claims=f"{TABLES}/claims.csv",
        figure=f"{FIGURES}/claims.png",
        runs=RUNS_TABLES,
    output:
        REPORT_SUMMARY,
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/logs/report_summary.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("report_summary"),
    shell:
        "{params.gf} report-summary --claims {input.claims} --figure {input.figure} --runs {input.runs}"
        " --out {output} --scale {params.scale} > {log} 2>&1"


rule verify:
    input:
        evidence=CLAIM_EVIDENCE,
        power=POWER_TABLE,
        drift_verdicts=DRIFT_VERDICTS,
        drift_sources=DRIFT_SOURCES,
    output:
        csv=f"{TABLES}/claims.csv",
        md=report(f"{TABLES}/claims.md", category="Claims"),
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/logs/verify.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("verify"),
    shell:
        "{params.gf} verify --evidence {input.evidence} --power {input.power} --drift-verdicts {input.drift_verdicts}"
        " --csv {output.csv} --md {output.md} --scale {params.scale} > {log} 2>&1"
