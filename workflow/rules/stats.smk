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


# The power table: for every claim (and part) the n at which its verdict is decided with 80% probability at the
# measured effect, and the wall time to get there. It reads the evidence files only, never a verdict; `verify`
# reads its CSV to name a claim's shortfall ("n = k of the N its power needs"): evidence -> power -> verify.
POWER_TABLE = f"{TABLES}/power.csv"


rule power_table:
    input:
        evidence=CLAIM_EVIDENCE,
    output:
        csv=POWER_TABLE,
        md=report(f"{TABLES}/power.md", category="Claims"),
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/logs/power_table.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("power_table"),
    shell:
        "{params.gf} power --evidence {input.evidence} --csv {output.csv} --md {output.md}"
        " --scale {params.scale} > {log} 2>&1"


REPORT_TARGETS.append(f"{TABLES}/power.md")
