# Study A part 1 (ds_audit, arXiv 2604.23747): which DeepSpeed configurations drop micro-batches (real DeepSpeed,
# CPU accelerator, gloo) and how a per-micro-batch loss mean mis-weights tokens. One job per (version, ranks)
# group runs every matrix case (several optimizer steps each) in the same rank processes (DeepSpeed start-up costs
# seconds, a case ~0.4 s):
#   results/<scale>/ds_audit/matrix/deepspeed~<v>/ranks~<r>/seed0/metrics.json
# The 0.18.9 groups run under {DS0189_ENV} (the overlay first on PYTHONPATH); the job checks the version it got.
from gradfidelity.studies.ds_audit.workflow import deepspeed_env, group_threads

DS_AUDIT_CFG = config["ds_audit"]
DS_AUDIT_GROUPS = expand(
    f"{RESULTS}/ds_audit/matrix/deepspeed~{{version}}/ranks~{{ranks}}/seed0/metrics.json",
    version=DS_AUDIT_CFG["matrix"]["versions"],
    ranks=DS_AUDIT_CFG["matrix"]["ranks"],
)
# A3's "about 2/N" is gradient alignment: measured on real SFT micro-batches by the sft_rl study (its first model),
# read here as a file.
DS_AUDIT_ALIGNMENT = f"{RESULTS}/sft_rl/{config['sft_rl']['models'][0]['name']}/alignment/seed0/metrics.json"
DS_AUDIT_TABLES = [f"{TABLES}/ds_fault_matrix.csv", f"{TABLES}/ds_fault_matrix.md",
                   f"{TABLES}/loss_aggregation.csv", f"{TABLES}/loss_aggregation.md",
                   f"{TABLES}/ds_norm_alignment.csv", f"{TABLES}/ds_norm_alignment.md"]
DS_AUDIT_FIGURES = [f"{FIGURES}/ds_fault_matrix.png", f"{FIGURES}/loss_aggregation.png"]

STUDY_RUNS["ds_audit"] = DS_AUDIT_GROUPS + [f"{RESULTS}/ds_audit/loss_agg/seed0/metrics.json", DS_AUDIT_ALIGNMENT]
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/ds_audit.json")
REPORT_TARGETS.extend(DS_AUDIT_TABLES + DS_AUDIT_FIGURES)


rule ds_audit_matrix_group:
    wildcard_constraints:
        version=r"\d+\.\d+\.\d+",
        ranks=r"\d+",
    output:
        f"{RESULTS}/ds_audit/matrix/deepspeed~{{version}}/ranks~{{ranks}}/seed0/metrics.json",
    params:
        gf=GF,
        cfg=study_cfg("ds_audit"),
        env=deepspeed_env(DS0189_ENV),
    log:
        f"{RESULTS}/ds_audit/logs/matrix_deepspeed~{{version}}_ranks~{{ranks}}.log",
    benchmark:
        f"{RESULTS}/ds_audit/matrix/deepspeed~{{version}}/ranks~{{ranks}}/seed0/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: group_threads
    resources:
        mem_mb=3000,
        runtime=30,
    shell:
        "{params.env} {params.gf} ds-audit-group --cfg {params.cfg} --version {wildcards.version} "
        "--ranks {wildcards.ranks} --metrics {output} > {log} 2>&1"


rule ds_audit_loss_agg:
    output:
        f"{RESULTS}/ds_audit/loss_agg/seed0/metrics.json",
    params:
        gf=GF,
        cfg=study_cfg("ds_audit"),
    log:
        f"{RESULTS}/ds_audit/logs/loss_agg.log",
    benchmark:
        f"{RESULTS}/ds_audit/loss_agg/seed0/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    shell:
        "{params.gf} ds-audit-loss-agg --cfg {params.cfg} --metrics {output} > {log} 2>&1"


rule ds_audit_tables:
    input:
        groups=DS_AUDIT_GROUPS,
        loss=f"{RESULTS}/ds_audit/loss_agg/seed0/metrics.json",
        alignment=DS_AUDIT_ALIGNMENT,
    output:
        matrix_csv=f"{TABLES}/ds_fault_matrix.csv",
        matrix_md=report(f"{TABLES}/ds_fault_matrix.md", category="ds_audit"),
        matrix_png=report(f"{FIGURES}/ds_fault_matrix.png", category="ds_audit"),
        loss_csv=f"{TABLES}/loss_aggregation.csv",
        loss_md=report(f"{TABLES}/loss_aggregation.md", category="ds_audit"),
        loss_png=report(f"{FIGURES}/loss_aggregation.png", category="ds_audit"),
        alignment_csv=f"{TABLES}/ds_norm_alignment.csv",
        alignment_md=report(f"{TABLES}/ds_norm_alignment.md", category="ds_audit"),
        evidence=f"{RESULTS}/claims/ds_audit.json",
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/ds_audit/logs/tables.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{params.gf} ds-audit-tables --groups {input.groups} --loss {input.loss} --matrix-csv {output.matrix_csv} "
        "--matrix-md {output.matrix_md} --matrix-png {output.matrix_png} --loss-csv {output.loss_csv} "
        "--loss-md {output.loss_md} --loss-png {output.loss_png} --alignment {input.alignment} "
        "--alignment-csv {output.alignment_csv} --alignment-md {output.alignment_md} --evidence {output.evidence} "
        "--scale {params.scale} > {log} 2>&1"


rule ds_audit:
    input:
        DS_AUDIT_TABLES,
        DS_AUDIT_FIGURES,
        f"{RESULTS}/claims/ds_audit.json",
