# Study C (Lex 2026): bounded-horizon local training on CPUs. Owned by the local study (see CONTRIBUTING.md).
# data -> one paired job per (corpus, width, seed) -> aggregate + statistics -> tables, figures, claim evidence.
# Rules only: the plan (cells, run paths), the config keys each job reads, threads and constraints come from the
# study's plan.py and rules.py.
LOCAL_CONFIG = STUDY_CONFIG["local"]
LOCAL_PLAN = study_module("local", "plan")
LOCAL_RULES = study_module("local", "rules")
LOCAL_RUNS = LOCAL_PLAN.runs(LOCAL_CONFIG, RESULTS)


wildcard_constraints:
    **LOCAL_RULES.WILDCARDS,


# One rule definition for both job groups (main: BP, best-BP candidates and the async methods, time-paired; mechanism:
# the serial local methods), instantiated once per group: the same command, threads and resources. Why not one rule
# with a {group} wildcard: the groups declare different numbers of outputs (one metrics.json per method), which a
# wildcard cannot vary; and why not one job per method: the methods of a cell must run back to back on the same
# machine (order reversed on odd seeds), or their throughput ratios would compare different nodes at the paper
# scale and different moments here.
for _group, _methods in LOCAL_PLAN.groups(LOCAL_CONFIG).items():
    if not _methods:
        continue

    rule:
        name:
            f"local_{_group}"
        input:
            train=f"{RESULTS}/local/data/{{corpus}}/train.bin",
            meta=f"{RESULTS}/local/data/{{corpus}}/meta.json",
        output:
            expand(LOCAL_PLAN.run_pattern(RESULTS), method=_methods, allow_missing=True),
        params:
            gf=GF,
            cfg=LOCAL_RULES.job_cfg(config["local"], "train"),
            methods=",".join(_methods),
            env=LOCAL_RULES.omp_env(LOCAL_CONFIG),
            run_dir=LOCAL_RULES.run_dir(study_root("local")),
            cell=cell_json,
        log:
            f"{RESULTS}/local/logs/{_group}_{{corpus}}_w{{width}}_seed{{seed}}.log",
        benchmark:
            f"{RESULTS}/local/{{corpus}}/w{{width}}/benchmark_{_group}_seed{{seed}}.tsv"
        conda:
            CONDA_ENV
        threads: LOCAL_RULES.threads(LOCAL_CONFIG, THREADS)
        resources:
            **rule_resources(f"local_{_group}"),
        shell:
            "{params.env}{params.gf} local-cell --cfg {params.cfg} --methods {params.methods}"
            " --data $(dirname {input.train}) --run-dir {params.run_dir} --cell {params.cell} > {log} 2>&1"


rule local_aggregate:
    input:
        LOCAL_RUNS,
    output:
        f"{RESULTS}/local/aggregate.csv",
    params:
        gf=GF,
        scale=SCALE,
    log:
        f"{RESULTS}/local/logs/aggregate.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("local_aggregate"),
    shell:
        "{params.gf} local-aggregate --scale {params.scale} --runs {input} --out {output} > {log} 2>&1"


rule local_tables:
    input:
        f"{RESULTS}/local/aggregate.csv",
    output:
        main_csv=f"{TABLES}/local_main.csv",
        main_md=report(f"{TABLES}/local_main.md", category="local"),
        mech_csv=f"{TABLES}/local_mechanism.csv",
        mech_md=report(f"{TABLES}/local_mechanism.md", category="local"),
    params:
        gf=GF,
        cfg=LOCAL_RULES.job_cfg(config["local"], "tables"),
    log:
        f"{RESULTS}/local/logs/tables.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("local_tables"),
    shell:
        "{params.gf} local-tables --cfg {params.cfg} --aggregate {input} --main-csv {output.main_csv}"
        " --main-md {output.main_md} --mech-csv {output.mech_csv} --mech-md {output.mech_md} > {log} 2>&1"


rule local_figures:
    input:
        f"{RESULTS}/local/aggregate.csv",
    output:
        frontier=report(f"{FIGURES}/local_frontier.png", category="local"),
        scaling=report(f"{FIGURES}/local_width_scaling.png", category="local"),
    params:
        gf=GF,
        cfg=LOCAL_RULES.job_cfg(config["local"], "figures"),
    log:
        f"{RESULTS}/local/logs/figures.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("local_figures"),
    shell:
        "{params.gf} local-figures --cfg {params.cfg} --aggregate {input} --frontier {output.frontier}"
        " --scaling {output.scaling} > {log} 2>&1"


rule local_claims:
    input:
        aggregate=f"{RESULTS}/local/aggregate.csv",
        main_csv=f"{TABLES}/local_main.csv",
        mech_csv=f"{TABLES}/local_mechanism.csv",
    output:
        f"{RESULTS}/claims/local.json",
    params:
        gf=GF,
        cfg=LOCAL_RULES.job_cfg(config["local"], "claims"),
        scale=SCALE,
    log:
        f"{RESULTS}/local/logs/claims.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("local_claims"),
    shell:
        "{params.gf} local-claims --cfg {params.cfg} --scale {params.scale} --aggregate {input.aggregate}"
        " --main-csv {input.main_csv} --mech-csv {input.mech_csv} --out {output} > {log} 2>&1"


rule local_bench:
    output:
        f"{RESULTS}/bench/local.json",
    params:
        gf=GF,
        env=LOCAL_RULES.omp_env(LOCAL_CONFIG),
        cfg=LOCAL_RULES.job_cfg(config["local"], "bench"),
    log:
        f"{RESULTS}/local/logs/bench.log",
    benchmark:
        f"{RESULTS}/bench/local_benchmark.tsv"
    conda:
        CONDA_ENV
    threads: LOCAL_RULES.threads(LOCAL_CONFIG, THREADS)
    resources:
        **rule_resources("local_bench"),
    shell:
        "{params.env}{params.gf} local-bench --cfg {params.cfg} --out {output} > {log} 2>&1"


rule local:
    input:
        rules.local_tables.output,
        rules.local_figures.output,
        rules.local_claims.output,
        f"{RESULTS}/bench/local.json",


STUDY_RUNS["local"] = LOCAL_RUNS
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/local.json")
REPORT_TARGETS.extend(
    [
        f"{TABLES}/local_main.md",
        f"{TABLES}/local_mechanism.md",
        f"{FIGURES}/local_frontier.png",
        f"{FIGURES}/local_width_scaling.png",
        f"{RESULTS}/bench/local.json",
    ]
)
