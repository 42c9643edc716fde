# The end of the DAG: every claim's verdict, computed from the studies' evidence files.


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
