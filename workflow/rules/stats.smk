# Statistics that need no training run: the study-C worked example (the paper's own numbers, recomputed).


rule stats_check:
    output:
        csv=f"{TABLES}/stats_check.csv",
        md=report(f"{TABLES}/stats_check.md", category="stats"),
        evidence=f"{RESULTS}/claims/stats.json",
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/logs/stats_check.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("stats_check"),
    shell:
        "{params.gf} stats-check --csv {output.csv} --md {output.md} --evidence {output.evidence}"
        " --scale {params.scale} 2>&1 | tee {log}"


CLAIM_EVIDENCE.append(f"{RESULTS}/claims/stats.json")
REPORT_TARGETS.append(f"{TABLES}/stats_check.md")
