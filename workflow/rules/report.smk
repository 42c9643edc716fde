# The end of the DAG: every claim's verdict, computed from the studies' evidence files, and one runs table per
# study (seed, status, metrics, git sha, versions, CPU, threads of every run), committed with the cpu scale.
RUNS_TABLES = expand(RESULTS + "/runs/{study}.csv", study=STUDIES)


rule runs_table:
    wildcard_constraints:
        study="|".join(STUDIES),
    input:
        study_runs,
    output:
        RESULTS + "/runs/{study}.csv",
    params:
        gf=GF,
        scale=SCALE,
    log:
        RESULTS + "/logs/runs_{study}.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "{params.gf} runs-table --runs {input} --scale {params.scale} --out {output} > {log} 2>&1"


rule verify:
    input:
        evidence=CLAIM_EVIDENCE,
    output:
        csv=TABLES + "/claims.csv",
        md=report(TABLES + "/claims.md", category="Claims"),
    params:
        gf=GF,
        scale=SCALE,
    log:
        RESULTS + "/logs/verify.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "{params.gf} verify --evidence {input.evidence} --csv {output.csv} --md {output.md} --scale {params.scale} > {log} 2>&1"
