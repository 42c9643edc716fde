# Study A part 1 (ds_audit, arXiv 2604.23747): which DeepSpeed configurations drop micro-batches (real DeepSpeed,
# CPU accelerator, gloo) and how a per-micro-batch loss mean mis-weights tokens. One job per (version, ranks)
# group runs every matrix case (plan.py); the 0.18.9 groups run under {DS0189_ENV} (the overlay first on
# PYTHONPATH) and check the version they got. Tables, figures and claim evidence are three jobs: a figure edit
# reruns no evidence. Plan, paths, wildcard constraints and per-job config keys: studies/ds_audit/{plan,rules}.py.
from gradfidelity.studies.ds_audit import plan as ds_audit_plan
from gradfidelity.studies.ds_audit import rules as ds_audit_rules

DS_AUDIT_GROUPS = ds_audit_plan.group_runs(STUDY_CONFIG["ds_audit"], RESULTS)
DS_AUDIT_LOSS = ds_audit_plan.loss_agg_file(RESULTS)
# A3's "about 2/N" is gradient alignment: measured on real SFT micro-batches by the sft_rl study (its first model),
# read here as a file.
DS_AUDIT_ALIGNMENT = cross_study_input("sft_rl", "alignment")
DS_AUDIT_TABLES = ds_audit_plan.tables(TABLES)
DS_AUDIT_FIGURES = ds_audit_plan.figures(FIGURES)
DS_AUDIT_EVIDENCE = ds_audit_plan.evidence(RESULTS)

STUDY_RUNS["ds_audit"] = DS_AUDIT_GROUPS + [DS_AUDIT_LOSS, DS_AUDIT_ALIGNMENT]
CLAIM_EVIDENCE.append(DS_AUDIT_EVIDENCE)
REPORT_TARGETS.extend(list(DS_AUDIT_TABLES.values()) + list(DS_AUDIT_FIGURES.values()))


# What each probe's record stands for (harness/identity.py): its `--cfg` (the DeepSpeed release and the rank count
# are its wildcards, its path).
DS_AUDIT_IDENTITY = {job: job_identity("ds_audit", job, ds_audit_rules.job_cfg(config["ds_audit"], job))
                     for job in ("matrix_group", "loss_agg")}


rule ds_audit_matrix_group:
    wildcard_constraints:
        **ds_audit_rules.WILDCARDS,
    input:
        unless_committed("ds_audit_matrix_group", ds_audit_plan.group_metrics(RESULTS), [],
                         identity=DS_AUDIT_IDENTITY["matrix_group"]),
    output:
        ds_audit_plan.group_metrics(RESULTS),
    params:
        gf=GF,
        cfg=ds_audit_rules.job_cfg(config["ds_audit"], "matrix_group"),
        env=ds_audit_rules.deepspeed_env(DS0189_ENV),
        run_dir=ds_audit_rules.run_dir,
        cell=cell_json,
        identity=identity_env(DS_AUDIT_IDENTITY["matrix_group"]),
    log:
        f"{RESULTS}/ds_audit/logs/matrix_deepspeed~{{version}}_ranks~{{ranks}}.log",
    benchmark:
        ds_audit_plan.group_file(RESULTS, "benchmark.tsv")
    conda:
        CONDA_ENV
    threads: ds_audit_rules.group_threads
    resources:
        **rule_resources("ds_audit_matrix_group"),
    shell:
        "{params.identity}{params.env} {params.gf} ds-audit-group --cfg {params.cfg} --version {wildcards.version} "
        "--ranks {wildcards.ranks} --run-dir {params.run_dir} --cell {params.cell} > {log} 2>&1"


rule ds_audit_loss_agg:
    input:
        unless_committed("ds_audit_loss_agg", DS_AUDIT_LOSS, [], identity=DS_AUDIT_IDENTITY["loss_agg"]),
    output:
        DS_AUDIT_LOSS,
    params:
        gf=GF,
        cfg=ds_audit_rules.job_cfg(config["ds_audit"], "loss_agg"),
        run_dir=ds_audit_rules.run_dir,
        cell=cell_json,
        identity=identity_env(DS_AUDIT_IDENTITY["loss_agg"]),
    log:
        f"{RESULTS}/ds_audit/logs/loss_agg.log",
    benchmark:
        ds_audit_plan.loss_agg_file(RESULTS, "benchmark.tsv")
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("ds_audit_loss_agg"),
    shell:
        "{params.identity}{params.gf} ds-audit-loss-agg --cfg {params.cfg} --run-dir {params.run_dir} --cell {params.cell} "
        "> {log} 2>&1"


rule ds_audit_tables:
    input:
        groups=DS_AUDIT_GROUPS,
        loss=DS_AUDIT_LOSS,
        alignment=DS_AUDIT_ALIGNMENT,
    output:
        matrix_csv=DS_AUDIT_TABLES["matrix_csv"],
        matrix_md=report(DS_AUDIT_TABLES["matrix_md"], category="ds_audit"),
        loss_csv=DS_AUDIT_TABLES["loss_csv"],
        loss_md=report(DS_AUDIT_TABLES["loss_md"], category="ds_audit"),
        alignment_csv=DS_AUDIT_TABLES["alignment_csv"],
        alignment_md=report(DS_AUDIT_TABLES["alignment_md"], category="ds_audit"),
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/ds_audit/logs/tables.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("ds_audit_tables"),
    shell:
        "{params.gf} ds-audit-tables --groups {input.groups} --loss {input.loss} --alignment {input.alignment} "
        "--matrix-csv {output.matrix_csv} --matrix-md {output.matrix_md} --loss-csv {output.loss_csv} "
        "--loss-md {output.loss_md} --alignment-csv {output.alignment_csv} --alignment-md {output.alignment_md} "
        "--scale {params.scale} > {log} 2>&1"


rule ds_audit_figures:
    input:
        groups=DS_AUDIT_GROUPS,
        loss=DS_AUDIT_LOSS,
    output:
        matrix_png=report(DS_AUDIT_FIGURES["matrix_png"], category="ds_audit"),
        loss_png=report(DS_AUDIT_FIGURES["loss_png"], category="ds_audit"),
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/ds_audit/logs/figures.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("ds_audit_figures"),
    shell:
        "{params.gf} ds-audit-figures --groups {input.groups} --loss {input.loss} "
        "--matrix-png {output.matrix_png} --loss-png {output.loss_png} --scale {params.scale} > {log} 2>&1"


rule ds_audit_claims:
    input:
        groups=DS_AUDIT_GROUPS,
        loss=DS_AUDIT_LOSS,
        alignment=DS_AUDIT_ALIGNMENT,
        **DS_AUDIT_TABLES,
    output:
        evidence=DS_AUDIT_EVIDENCE,
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/ds_audit/logs/claims.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("ds_audit_claims"),
    shell:
        "{params.gf} ds-audit-claims --groups {input.groups} --loss {input.loss} --alignment {input.alignment} "
        "--matrix-csv {input.matrix_csv} --matrix-md {input.matrix_md} --loss-csv {input.loss_csv} "
        "--loss-md {input.loss_md} --alignment-csv {input.alignment_csv} --alignment-md {input.alignment_md} "
        "--evidence {output.evidence} --scale {params.scale} > {log} 2>&1"


rule ds_audit:
    input:
        list(DS_AUDIT_TABLES.values()),
        list(DS_AUDIT_FIGURES.values()),
        DS_AUDIT_EVIDENCE,
