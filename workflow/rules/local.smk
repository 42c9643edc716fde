# Study C (Lex 2026): bounded-horizon local training on CPUs. Owned by the local study (see CONTRIBUTING.md).
# data -> one paired job per (corpus, width, seed) -> aggregate + statistics -> tables, figures, claim evidence.
# Rules only: the plan (cells, run paths), the config keys each job reads, threads and constraints come from the
# study's plan.py and rules.py.
from types import SimpleNamespace

LOCAL_CONFIG = STUDY_CONFIG["local"]
LOCAL_PLAN = study_module("local", "plan")
LOCAL_RULES = study_module("local", "rules")
LOCAL_RUNS = LOCAL_PLAN.runs(LOCAL_CONFIG, RESULTS)
LOCAL_MEMORY_RUNS = LOCAL_PLAN.memory_runs(LOCAL_CONFIG, RESULTS)


wildcard_constraints:
    **LOCAL_RULES.WILDCARDS,


# Data: the byte corpora written once to results/<scale>/local/data/<corpus>/ and read by every cell.
LOCAL_CORPUS_CHECK = study_module("local", "corpus_check")
# Study C's `source: file` corpora are inputs of the data rule (a changed file redoes the splits). The cpu scale's
# real-text stand-in is built from Debian's python3.11-doc (docs/sources.md, "Study C: the cpu scale's text").
LOCAL_PYDOCS = LOCAL_RULES.EXPORTS["python_docs"](LOCAL_CONFIG, RESULTS)  # the one name of the file (study B reads it)
LOCAL_PYDOCS_MD5 = LOCAL_RULES.EXPORT_MD5["python_docs"]
# Where `make cpu-data` unpacks the pinned .deb (inside the checkout: nothing is installed). A scratch copy of the
# checkout (check-reference) passes the checkout's own with --config pydocs_root=... (outside the local section, so
# it is no part of any job's identity).
LOCAL_PYDOCS_ROOT = config.get("pydocs_root") or str(
    REPO / ".cache/python3.11-doc/3.11.2-6+deb12u9/usr/share/doc/python3.11/html/_sources")


# Each path must exist or be made by a rule of this run (here: local_corpus_pydocs at this scale), else the workflow
# refuses it as it loads, naming the key and, for another scale's results/<scale>/ path, both scales (not a bare
# MissingInputException when the DAG is built). Each corpus's data job reads its own file alone: a user's text
# never waits for the Python-docs build.
LOCAL_FILE_SOURCES = LOCAL_CORPUS_CHECK.file_sources(
    config["local"]["corpora"], SCALE, produced={LOCAL_PYDOCS: "local_corpus_pydocs"}
)


rule local_corpus_pydocs:
    output:
        LOCAL_PYDOCS,
    params:
        gf=GF,
        md5=LOCAL_PYDOCS_MD5,
        root=LOCAL_PYDOCS_ROOT,
    log:
        f"{RESULTS}/local/logs/corpus_pydocs.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("local_corpus_pydocs"),
    shell:
        "{params.gf} local-corpus --root {params.root} --suffix .rst.txt"
        " --md5 {params.md5} --out {output} > {log} 2>&1"


rule local_data:
    input:
        LOCAL_RULES.corpus_source(config["local"]),
    output:
        train=f"{RESULTS}/local/data/{{corpus}}/train.bin",
        val=f"{RESULTS}/local/data/{{corpus}}/val.bin",
        meta=f"{RESULTS}/local/data/{{corpus}}/meta.json",
    params:
        gf=GF,
        cfg=LOCAL_RULES.data_cfg(config["local"]),  # only this corpus's entry of local.corpora
    log:
        f"{RESULTS}/local/logs/data_{{corpus}}.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("local_data"),
    shell:
        "{params.gf} local-data --cfg {params.cfg} --corpus {wildcards.corpus}"
        " --out $(dirname {output.meta}) > {log} 2>&1"


# What each training job's record stands for (harness/identity.py): its `--cfg` and its corpus.
LOCAL_TRAIN_IDENTITY = job_identity("local", "train", LOCAL_RULES.job_cfg(config["local"], "train"),
                                    LOCAL_RULES.train_identity(config["local"]))
LOCAL_MEMORY_IDENTITY = job_identity("local", "memory", LOCAL_RULES.job_cfg(config["local"], "memory"),
                                     LOCAL_RULES.corpus_identity(config["local"], LOCAL_CONFIG.main_corpus))


# A paired job writes every method of its cell: a cell that already has some methods' standing records (made by another
# group: one more main seed is a seed the power and control groups ran) would have them overwritten. Refused as the
# workflow loads, naming the cells and the way out.
_LOCAL_PARTIAL = LOCAL_RULES.partial_cells(
    LOCAL_PLAN.groups(LOCAL_CONFIG).values(), LOCAL_PLAN.run_pattern(RESULTS),
    lambda path, corpus: record_stands(path, LOCAL_TRAIN_IDENTITY(SimpleNamespace(corpus=corpus))),
)
if _LOCAL_PARTIAL:
    raise UserError(
        "local: these cells overlap runs another group made, and their jobs would overwrite them: "
        + "; ".join(_LOCAL_PARTIAL[:4]) + (" ..." if len(_LOCAL_PARTIAL) > 4 else "")
        + ". One more seed of C4 is one more quality seed (local.quality_seeds and local.control_seeds), of C8 and C9 "
        "one more mechanism seed (local.mechanism_seeds); the main cell (local.seeds) grows only past the power, "
        "quality and control seeds (src/gradfidelity/studies/local/README.md, 'How to extend')"
    )


# One rule definition for every job group (plan.py: main, side, power, mechanism), instantiated once per group:
# the same command, threads and resources. Why not one rule with a {group} wildcard: the groups declare different
# methods, hence different outputs, which a wildcard cannot vary; and why not one job per method: the methods of a
# cell must run back to back on the same machine (order reversed on odd seeds), or their throughput ratios would
# compare different nodes at the paper scale and different moments here. Groups that share a method (BP) are kept
# apart by their widths or seeds: each rule's wildcard constraints match only its own cells.
for _group in LOCAL_PLAN.groups(LOCAL_CONFIG).values():

    rule:
        name:
            f"local_{_group.name}"
        input:
            unpack(unless_committed(f"local_{_group.name}", LOCAL_RULES.group_record(LOCAL_PLAN, RESULTS, _group), {
                "train": f"{RESULTS}/local/data/{{corpus}}/train.bin",
                "meta": f"{RESULTS}/local/data/{{corpus}}/meta.json"}, identity=LOCAL_TRAIN_IDENTITY,
                records=expand(LOCAL_PLAN.run_pattern(RESULTS), method=_group.methods, allow_missing=True))),
        output:
            expand(LOCAL_PLAN.run_pattern(RESULTS), method=_group.methods, allow_missing=True),
        wildcard_constraints:
            **_group.constraints,
        params:
            gf=GF,
            cfg=LOCAL_RULES.job_cfg(config["local"], "train"),
            methods=",".join(_group.methods),
            env=LOCAL_RULES.omp_env(LOCAL_CONFIG),
            run_dir=LOCAL_RULES.run_dir(study_root("local")),
            cell=cell_json,
            shares=LOCAL_RULES.shares_flag(_group),
            identity=identity_env(LOCAL_TRAIN_IDENTITY),
        log:
            f"{RESULTS}/local/logs/{_group.name}_{{corpus}}_w{{width}}_seed{{seed}}.log",
        benchmark:
            f"{RESULTS}/local/{{corpus}}/w{{width}}/benchmark_{_group.name}_seed{{seed}}.tsv"
        conda:
            CONDA_ENV
        threads: LOCAL_RULES.threads(LOCAL_CONFIG, THREADS, _group)
        resources:
            **rule_resources(f"local_{_group.name}"),
        shell:
            "{params.identity}{params.env}{params.gf} local-cell --cfg {params.cfg} --methods {params.methods}{params.shares}"
            " --data $(dirname {input.train}) --run-dir {params.run_dir} --cell {params.cell} > {log} 2>&1"


# C3's memory probe (memory.py): one job per probe seed, BP and async RGC each with its model and as its bare
# process tree, on the training split of `main_corpus`. It owns the machine like a training cell (a second job's
# pages would not enter the tree's PSS, but its CPU would slow the probe's steps).
rule local_memory:
    input:
        unpack(unless_committed("local_memory", f"{RESULTS}/local/memory/w{{width}}/seed{{seed}}/metrics.json", {
            "train": f"{RESULTS}/local/data/{LOCAL_CONFIG.main_corpus}/train.bin",
            "meta": f"{RESULTS}/local/data/{LOCAL_CONFIG.main_corpus}/meta.json"}, identity=LOCAL_MEMORY_IDENTITY)),
    output:
        f"{RESULTS}/local/memory/w{{width}}/seed{{seed}}/metrics.json",
    params:
        gf=GF,
        cfg=LOCAL_RULES.job_cfg(config["local"], "memory"),
        env=LOCAL_RULES.omp_env(LOCAL_CONFIG),
        cell=cell_json,
        identity=identity_env(LOCAL_MEMORY_IDENTITY),
    log:
        f"{RESULTS}/local/logs/memory_w{{width}}_seed{{seed}}.log",
    conda:
        CONDA_ENV
    threads: LOCAL_RULES.threads(LOCAL_CONFIG, THREADS)
    resources:
        **rule_resources("local_memory"),
    shell:
        "{params.identity}{params.env}{params.gf} local-memory --cfg {params.cfg} --data $(dirname {input.train})"
        " --run-dir $(dirname {output}) --cell {params.cell} > {log} 2>&1"


rule local_aggregate:
    input:
        runs=LOCAL_RUNS,
        memory=LOCAL_MEMORY_RUNS,
    output:
        runs=f"{RESULTS}/local/aggregate.csv",
        memory=f"{RESULTS}/local/memory.csv",
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
        "{params.gf} local-aggregate --scale {params.scale} --runs {input.runs} --memory-runs {input.memory}"
        " --out {output.runs} --memory-out {output.memory} > {log} 2>&1"


rule local_tables:
    input:
        aggregate=f"{RESULTS}/local/aggregate.csv",
        memory=f"{RESULTS}/local/memory.csv",
    output:
        main_csv=f"{TABLES}/local_main.csv",
        main_md=report(f"{TABLES}/local_main.md", category="local"),
        mech_csv=f"{TABLES}/local_mechanism.csv",
        mech_md=report(f"{TABLES}/local_mechanism.md", category="local"),
        mem_csv=f"{TABLES}/local_memory.csv",
        mem_md=report(f"{TABLES}/local_memory.md", category="local"),
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
        "{params.gf} local-tables --cfg {params.cfg} --aggregate {input.aggregate} --memory {input.memory}"
        " --main-csv {output.main_csv} --main-md {output.main_md} --mech-csv {output.mech_csv}"
        " --mech-md {output.mech_md} --mem-csv {output.mem_csv} --mem-md {output.mem_md} > {log} 2>&1"


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
        memory=f"{RESULTS}/local/memory.csv",
        main_csv=f"{TABLES}/local_main.csv",
        mech_csv=f"{TABLES}/local_mechanism.csv",
        mem_csv=f"{TABLES}/local_memory.csv",
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
        " --memory {input.memory} --main-csv {input.main_csv} --mech-csv {input.mech_csv}"
        " --mem-csv {input.mem_csv} --out {output} > {log} 2>&1"


rule local_bench:
    output:
        report(f"{RESULTS}/bench/local.json", category="local"),
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


STUDY_RUNS["local"] = LOCAL_RUNS + LOCAL_MEMORY_RUNS
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/local.json")
REPORT_TARGETS.extend(
    [
        f"{TABLES}/local_main.md",
        f"{TABLES}/local_mechanism.md",
        f"{TABLES}/local_memory.md",
        f"{FIGURES}/local_frontier.png",
        f"{FIGURES}/local_width_scaling.png",
        f"{RESULTS}/bench/local.json",
    ]
)
