# Study C (Lex 2026): bounded-horizon local training on CPUs. Owned by the local study (see CONTRIBUTING.md).
# data -> one paired job per (corpus, width, seed) -> aggregate + statistics -> tables, figures, claim evidence.
LOCAL = config["local"]
LOCAL_MAIN = [m for m in ("bp", "bp_tm", "broadcast_async", "rgc_async") if m in LOCAL["methods"]]
LOCAL_SERIAL = [m for m in ("live_local", "broadcast_serial", "rgc_serial") if m in LOCAL["methods"]]
# A training job owns the machine: throughput is the measurement, so two jobs must never share the cores.
LOCAL_THREADS = max(THREADS, LOCAL["train"]["n_stages"] * LOCAL["train"]["threads_per_stage"])
# Exported before the interpreter starts (libgomp reads it once, at load).
LOCAL_OMP = LOCAL["train"].get("omp_wait_policy", "")
LOCAL_ENV = f"OMP_WAIT_POLICY={LOCAL_OMP} " if LOCAL_OMP else ""
# Training and report jobs see everything but the bench section (a bench change must not retrain).
LOCAL_CFG = shlex.quote(json.dumps({k: v for k, v in LOCAL.items() if k != "bench"}, sort_keys=True))
LOCAL_RUN = f"{RESULTS}/local/{{corpus}}/w{{width}}/{{method}}/seed{{seed}}/metrics.json"
LOCAL_WIDTHS = {c: (LOCAL["corpora"][c].get("widths") or LOCAL["widths"]) for c in LOCAL["corpora"]}



# Paired seeds of one (corpus, width) cell: the corpus's own count (or `seeds`), capped by `side_seeds` away from the
# main width.
LOCAL_CELL_SEEDS = {
    (c, w): range(
        min(
            LOCAL["corpora"][c].get("seeds") or LOCAL["seeds"],
            (LOCAL.get("side_seeds") or LOCAL["seeds"]) if w != LOCAL["main_width"] else LOCAL["seeds"],
        )
    )
    for c in LOCAL["corpora"]
    for w in LOCAL_WIDTHS[c]
}


LOCAL_RUNS = [
    LOCAL_RUN.format(corpus=c, width=w, method=m, seed=k)
    for c in LOCAL["corpora"]
    for w in LOCAL_WIDTHS[c]
    for k in LOCAL_CELL_SEEDS[(c, w)]
    for m in LOCAL_MAIN
] + [
    LOCAL_RUN.format(corpus=c, width=w, method=m, seed=k)
    for c in LOCAL["mechanism_corpora"]
    for w in LOCAL["mechanism_widths"]
    for k in range(LOCAL.get("mechanism_seeds") or LOCAL["seeds"])
    for m in LOCAL_SERIAL
]


wildcard_constraints:
    width=r"\d+",
    seed=r"\d+",
    corpus="enwik8|tinystories",


# One rule definition for both job groups (main: BP, best-BP candidates and the async methods, time-paired; mechanism:
# the serial local methods), instantiated once per group: the same command, threads and resources. Why not one rule
# with a {group} wildcard: the groups declare different numbers of outputs (one metrics.json per method), which a
# wildcard cannot vary; and why not one job per method: the methods of a cell must run back to back on the same
# machine (order reversed on odd seeds), or their throughput ratios would compare different nodes at the paper
# scale and different moments here.
LOCAL_GROUPS = {"main": LOCAL_MAIN, "mechanism": LOCAL_SERIAL}
for _group, _methods in LOCAL_GROUPS.items():
    if not _methods:
        continue

    rule:
        name:
            f"local_{_group}"
        input:
            train=f"{RESULTS}/local/data/{{corpus}}/train.bin",
            meta=f"{RESULTS}/local/data/{{corpus}}/meta.json",
        output:
            expand(LOCAL_RUN, method=_methods, allow_missing=True),
        params:
            gf=GF,
            cfg=LOCAL_CFG,
            methods=",".join(_methods),
            env=LOCAL_ENV,
            root=study_root("local"),
        log:
            f"{RESULTS}/local/logs/{_group}_{{corpus}}_w{{width}}_seed{{seed}}.log",
        benchmark:
            f"{RESULTS}/local/{{corpus}}/w{{width}}/benchmark_{_group}_seed{{seed}}.tsv"
        conda:
            CONDA_ENV
        threads: LOCAL_THREADS
        resources:
            **cluster_resources(f"local_{_group}", mem_mb=8000, runtime=600),
        shell:
            "{params.env}{params.gf} local-cell --cfg {params.cfg} --corpus {wildcards.corpus}"
            " --width {wildcards.width} --seed {wildcards.seed} --methods {params.methods}"
            " --data $(dirname {input.train}) --root {params.root} > {log} 2>&1"


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
        mem_mb=2000,
        runtime=10,
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
        cfg=LOCAL_CFG,
    log:
        f"{RESULTS}/local/logs/tables.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
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
        cfg=LOCAL_CFG,
    log:
        f"{RESULTS}/local/logs/figures.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
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
        cfg=LOCAL_CFG,
        scale=SCALE,
    log:
        f"{RESULTS}/local/logs/claims.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{params.gf} local-claims --cfg {params.cfg} --scale {params.scale} --aggregate {input.aggregate}"
        " --main-csv {input.main_csv} --mech-csv {input.mech_csv} --out {output} > {log} 2>&1"


rule local_bench:
    output:
        f"{RESULTS}/bench/local.json",
    params:
        gf=GF,
        env=LOCAL_ENV,
        cfg=study_cfg("local"),
    log:
        f"{RESULTS}/local/logs/bench.log",
    benchmark:
        f"{RESULTS}/bench/local_benchmark.tsv"
    conda:
        CONDA_ENV
    threads: LOCAL_THREADS
    resources:
        **cluster_resources("local_bench", mem_mb=8000, runtime=120),
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
