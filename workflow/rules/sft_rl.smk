# Study A part 2 (sft_rl, arXiv 2604.23747): SFT-then-RL vs mixed-policy methods on fixed and buggy infrastructure,
# TRL SFTTrainer / GRPOTrainer on DeepSpeed ZeRO-2 + CPU optimizer offload.
#   results/<scale>/sft_rl/<model>/base/seed<b>/                base models (pretrained on task prompt -> completion pairs; base_seeds)
#   results/<scale>/sft_rl/<model>/<variant>/sft/seed<k>/       SFT; ds_bug/both run under {DS0189_ENV}
#   results/<scale>/sft_rl/<model>/<variant>/<method>/seed<k>/  rl, sft_then_rl, luffy, srft, relift, hpt (GRPO-based)
#   results/<scale>/sft_rl/<model>/alignment/seed0/              micro-batch gradient Gram matrices (read by ds_audit A3)
#   results/<scale>/sft_rl/<model>/lr_grid/<method>/lr<lr>/seed<s>/  LR selection (selection seed s, lr_selection)
# Order with lr_selection.lrs set: the grid (every RL-stage arm x lr, grown past a winning edge in rounds) ->
# lr_selection.json -> every RL-stage run trains at its arm's chosen LR.
# Checkpoints are shared through rule outputs: every SFT-then-RL reads its SFT run, every method the base model.
# Plans, paths, constraints and each job's config keys come from the study's plan and rules modules.
from gradfidelity.studies.sft_rl import plan as sft_rl_plan, rules as sft_rl_rules

SFT_RL_SECTION = config["sft_rl"]
SFT_RL = STUDY_CONFIG["sft_rl"]
SFT_RL_ROOT = f"{RESULTS}/sft_rl"
SFT_RL_DIR = sft_rl_rules.patterns(SFT_RL_ROOT)
# SFT and RL jobs start `ranks` processes (torchrun) and request one GPU per rank at the paper scale.
SFT_RL_LAUNCH = sft_rl_rules.launcher(GF_PY, SFT_RL.ranks)
SFT_RL_GPUS = sft_rl_rules.gpus(SFT_RL, SCALE)
SFT_RL_RUNS = sft_rl_plan.planned_runs(SFT_RL, SFT_RL_ROOT)
SFT_RL_BASE_RUNS = sft_rl_plan.base_runs(SFT_RL, SFT_RL_ROOT)
SFT_RL_TABLES = sft_rl_plan.table_paths(TABLES)
SFT_RL_FIGURES = sft_rl_plan.figure_paths(FIGURES)
SFT_RL_SELECTION = sft_rl_plan.selection_path(SFT_RL_ROOT)
SFT_RL_SELECTION_TABLE = sft_rl_plan.selection_table_paths(TABLES)
SFT_RL_STARTS = sft_rl_plan.starts_paths(TABLES)
_sft_rl_base_start = sft_rl_rules.base_start(SFT_RL, SFT_RL_ROOT, is_committed)  # the base model's run, or its replay
SFT_RL_LRS = " ".join(f"{lr:g}" for lr in SFT_RL.lr_selection.lrs)

# The runs table lists every run: the shared base models, the planned runs and the LR grid of every round (the
# aggregate reads the base models and the planned runs).
STUDY_RUNS["sft_rl"] = sft_rl_rules.study_runs(SFT_RL, SFT_RL_ROOT, checkpoints, SFT_RL_BASE_RUNS + SFT_RL_RUNS)
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/sft_rl.json")
REPORT_TARGETS.extend(list(SFT_RL_TABLES.values()) + list(SFT_RL_FIGURES.values()) + list(SFT_RL_STARTS.values()))
if SFT_RL.lr_selection.enabled:
    REPORT_TARGETS.append(SFT_RL_SELECTION_TABLE["md"])
# Round 5: each run at an earlier budget against the earlier records of its cell (compare_with, earlier.py)
SFT_RL_COMPARE = (sft_rl_plan.compare_paths(TABLES, SFT_RL.compare_with.rl_steps)
                  if SFT_RL.compare_with.enabled else {})
if SFT_RL_COMPARE:
    REPORT_TARGETS.append(SFT_RL_COMPARE["md"])
if SFT_RL.rl.length_groups > 0:  # the bench compares the trimmed path with the padded one: none without the trim
    REPORT_TARGETS.append(f"{RESULTS}/bench/sft_rl.json")


# What each training job's record stands for (harness/identity.py): its `--cfg` and the identity of its start.
SFT_RL_IDENTITY = {job: job_identity("sft_rl", job, sft_rl_rules.job_cfg(SFT_RL_SECTION, job),
                                     sft_rl_rules.start_identity(SFT_RL_SECTION, job))
                   for job in ("pretrain", "sft", "alignment", "rl")}


rule sft_rl_base:
    wildcard_constraints:
        **sft_rl_rules.constraints("seed"),
    input:
        unless_committed("sft_rl_base", f"{SFT_RL_DIR['base']}/metrics.json", [],
                         identity=SFT_RL_IDENTITY["pretrain"]),
    output:
        f"{SFT_RL_DIR['base']}/metrics.json",
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "pretrain"),
        cell=cell_json,
        identity=identity_env(SFT_RL_IDENTITY["pretrain"]),
    log:
        f"{SFT_RL_ROOT}/logs/{{model}}_base_seed{{seed}}.log",
    benchmark:
        f"{SFT_RL_DIR['base']}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL.threads
    resources:
        **rule_resources("sft_rl_base"),
    shell:
        "{params.identity}{params.gf} sft-rl-pretrain --cfg {params.cfg} --model {wildcards.model} "
        "--seed {wildcards.seed} --run-dir $(dirname {output}) --cell {params.cell} > {log} 2>&1"


rule sft_rl_sft:
    wildcard_constraints:
        **sft_rl_rules.constraints("variant", "seed"),
    input:
        unpack(unless_committed("sft_rl_sft", f"{SFT_RL_DIR['sft']}/metrics.json",
                                lambda w: {"base": _sft_rl_base_start(w)}, identity=SFT_RL_IDENTITY["sft"])),
    output:
        f"{SFT_RL_DIR['sft']}/metrics.json",
    params:
        gf=SFT_RL_LAUNCH,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "sft"),
        env=sft_rl_rules.deepspeed_env(SFT_RL, DS0189_ENV, "sft"),
        cell=cell_json,
        identity=identity_env(SFT_RL_IDENTITY["sft"]),
    log:
        f"{SFT_RL_ROOT}/logs/{{model}}_{{variant}}_sft_seed{{seed}}.log",
    benchmark:
        f"{SFT_RL_DIR['sft']}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL.threads
    resources:
        **rule_resources("sft_rl_sft", gpu=SFT_RL_GPUS),
    shell:
        "{params.identity}{params.env} {params.gf} sft-rl-sft --cfg {params.cfg} --model {wildcards.model} "
        "--variant {wildcards.variant} --seed {wildcards.seed} --base $(dirname {input.base}) "
        "--run-dir $(dirname {output}) --cell {params.cell} > {log} 2>&1"


# A committed record's model is not committed. A new cell that starts from it (one more seed, a longer arm) starts
# from its replay: the same job redone in <run>/replay/ from the same start, whose record must equal the committed
# one (harness/records.py check: bit for bit on the same host type, within the measured drift elsewhere) before
# anything trains on it. A mismatch fails the replay, naming both records; nothing committed is touched.
rule sft_rl_replay_base:
    wildcard_constraints:
        **sft_rl_rules.constraints("seed"),
    input:
        record=f"{SFT_RL_DIR['base']}/metrics.json",
    output:
        f"{SFT_RL_DIR['base']}/{sft_rl_rules.REPLAY}/metrics.json",
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "pretrain"),
        cell=cell_json,
    log:
        f"{SFT_RL_ROOT}/logs/{{model}}_base_seed{{seed}}_replay.log",
    conda:
        CONDA_ENV
    threads: SFT_RL.threads
    resources:
        **rule_resources("sft_rl_replay_base"),
    shell:
        "{params.gf} sft-rl-pretrain --cfg {params.cfg} --model {wildcards.model} --seed {wildcards.seed} "
        "--run-dir $(dirname {output}) "
        "--cell {params.cell} > {log} 2>&1 && {params.gf} check-record --committed {input.record} --fresh {output} "
        ">> {log} 2>&1"


rule sft_rl_replay_sft:
    wildcard_constraints:
        **sft_rl_rules.constraints("variant", "seed"),
    input:
        record=f"{SFT_RL_DIR['sft']}/metrics.json",
        base=_sft_rl_base_start,
    output:
        f"{SFT_RL_DIR['sft']}/{sft_rl_rules.REPLAY}/metrics.json",
    params:
        gf=SFT_RL_LAUNCH,
        check=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "sft"),
        env=sft_rl_rules.deepspeed_env(SFT_RL, DS0189_ENV, "sft"),
        cell=cell_json,
    log:
        f"{SFT_RL_ROOT}/logs/{{model}}_{{variant}}_sft_seed{{seed}}_replay.log",
    conda:
        CONDA_ENV
    threads: SFT_RL.threads
    resources:
        **rule_resources("sft_rl_replay_sft", gpu=SFT_RL_GPUS),
    shell:
        "{params.env} {params.gf} sft-rl-sft --cfg {params.cfg} --model {wildcards.model} --variant {wildcards.variant} "
        "--seed {wildcards.seed} --base $(dirname {input.base}) --run-dir $(dirname {output}) --cell {params.cell} "
        "> {log} 2>&1 && {params.check} check-record --committed {input.record} --fresh {output} >> {log} 2>&1"


rule sft_rl_alignment:
    # Exported for ds_audit's A3 (its path: plan.alignment_metrics): Gram matrices of the per-micro-batch gradients
    # of SFT's first windows at the base model.
    input:
        unpack(unless_committed("sft_rl_alignment", f"{SFT_RL_DIR['alignment']}/metrics.json",
                                lambda w: {"base": _sft_rl_base_start(w)}, identity=SFT_RL_IDENTITY["alignment"])),
    output:
        f"{SFT_RL_DIR['alignment']}/metrics.json",
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "alignment"),
        cell=cell_json,
        identity=identity_env(SFT_RL_IDENTITY["alignment"]),
    log:
        f"{SFT_RL_ROOT}/logs/{{model}}_alignment.log",
    benchmark:
        f"{SFT_RL_DIR['alignment']}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL.threads
    resources:
        **rule_resources("sft_rl_alignment"),
    shell:
        "{params.identity}{params.gf} sft-rl-alignment --cfg {params.cfg} --model {wildcards.model} --base $(dirname {input.base}) "
        "--run-dir $(dirname {output}) --cell {params.cell} > {log} 2>&1"


rule sft_rl_rl:
    wildcard_constraints:
        **sft_rl_rules.constraints("variant", "method", "seed"),
    input:
        unpack(unless_committed("sft_rl_rl", f"{SFT_RL_DIR['rl']}/metrics.json", sft_rl_rules.rl_inputs(
            SFT_RL, SFT_RL_ROOT, given_lr_selection(SFT_RL_SELECTION), is_committed),
            identity=SFT_RL_IDENTITY["rl"])),
    output:
        f"{SFT_RL_DIR['rl']}/metrics.json",
    params:
        gf=SFT_RL_LAUNCH,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "rl"),
        env=sft_rl_rules.deepspeed_env(SFT_RL, DS0189_ENV, "rl"),
        lr=sft_rl_rules.lr_option,
        cell=cell_json,
        identity=identity_env(SFT_RL_IDENTITY["rl"]),
    log:
        f"{SFT_RL_ROOT}/logs/{{model}}_{{variant}}_{{method}}_seed{{seed}}.log",
    benchmark:
        f"{SFT_RL_DIR['rl']}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL.threads
    resources:
        **rule_resources("sft_rl_rl", gpu=SFT_RL_GPUS),
    shell:
        "{params.identity}{params.env} {params.gf} sft-rl-rl --cfg {params.cfg} --model {wildcards.model} "
        "--variant {wildcards.variant} --method {wildcards.method} --seed {wildcards.seed} "
        "--init $(dirname {input.init}) {params.lr} "
        "--run-dir $(dirname {output}) --cell {params.cell} > {log} 2>&1"


rule sft_rl_grid:
    # One LR-selection run: an RL-stage arm at one learning rate on the selection seed, fixed infrastructure.
    wildcard_constraints:
        **sft_rl_rules.constraints("method", "lr", "seed"),
    input:
        unpack(unless_committed("sft_rl_grid", f"{SFT_RL_DIR['grid']}/metrics.json",
                                lambda w: {"init": sft_rl_rules.grid_init(SFT_RL, SFT_RL_ROOT, is_committed)(w)},
                                identity=SFT_RL_IDENTITY["rl"])),
    output:
        f"{SFT_RL_DIR['grid']}/metrics.json",
    params:
        gf=SFT_RL_LAUNCH,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "rl"),
        cell=cell_json,
        identity=identity_env(SFT_RL_IDENTITY["rl"]),
    log:
        f"{SFT_RL_ROOT}/logs/{{model}}_lr_grid_{{method}}_lr{{lr}}_seed{{seed}}.log",
    benchmark:
        f"{SFT_RL_DIR['grid']}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL.threads
    resources:
        **rule_resources("sft_rl_grid", gpu=SFT_RL_GPUS),
    shell:
        "{params.identity}{params.gf} sft-rl-rl --cfg {params.cfg} --model {wildcards.model} --variant fixed "
        "--method {wildcards.method} --seed {wildcards.seed} --init $(dirname {input.init}) --lr {wildcards.lr} "
        "--run-dir $(dirname {output}) --cell {params.cell} > {log} 2>&1"


# The LR grid in rounds: round k reads the grid runs so far and lists the points round k+1 adds (`factor` past a
# winning edge); Snakemake re-evaluates the DAG after each round (a checkpoint), and the selection waits for the
# first round that adds nothing (lr_select.py).
checkpoint sft_rl_lr_round:
    input:
        # a committed round's document stands like a committed record (its grid runs ancient): a fresh clone's file
        # times must not rerun it, since every run after it would then wait for the round to be re-read
        unless_committed("sft_rl_lr_round", f"{SFT_RL_ROOT}/{sft_rl_plan.LR_ROUND}",
                         sft_rl_rules.lr_round_input(SFT_RL, SFT_RL_ROOT, checkpoints)),
    output:
        f"{SFT_RL_ROOT}/{sft_rl_plan.LR_ROUND}",
    wildcard_constraints:
        **sft_rl_rules.constraints("round"),
    params:
        gf=GF,
        scale=SCALE,
        lrs=SFT_RL_LRS,
        factor=SFT_RL.lr_selection.factor,
        max_extensions=SFT_RL.lr_selection.max_extensions,
    log:
        f"{SFT_RL_ROOT}/logs/lr_round{{round}}.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("sft_rl_lr_round"),
    shell:
        "{params.gf} sft-rl-lr-round --metrics {input} --scale {params.scale} --lrs {params.lrs} "
        "--factor {params.factor} --max-extensions {params.max_extensions} --out {output} > {log} 2>&1"


rule sft_rl_select_lr:
    input:
        grid=sft_rl_rules.lr_grid_input(SFT_RL, SFT_RL_ROOT, checkpoints),
        # each arm's start (the base model; SFT-then-RL: the fixed SFT of the selection seed), read on val
        starts=list(sft_rl_rules.selection_starts(SFT_RL, SFT_RL_ROOT).values()),
    output:
        selection=SFT_RL_SELECTION,
        table=SFT_RL_SELECTION_TABLE["csv"],
        table_md=report(SFT_RL_SELECTION_TABLE["md"], category="sft_rl"),
    params:
        gf=GF,
        scale=SCALE,
        lrs=SFT_RL_LRS,
        starts=" ".join(f"{m}={p}" for m, p in sft_rl_rules.selection_starts(SFT_RL, SFT_RL_ROOT).items()),
        n_val=SFT_RL.task.n_val,
    log:
        f"{SFT_RL_ROOT}/logs/select_lr.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("sft_rl_select_lr"),
    shell:
        "{params.gf} sft-rl-select-lr --metrics {input.grid} --scale {params.scale} --lrs {params.lrs} "
        "--start {params.starts} --n-val {params.n_val} --out {output.selection} --table {output.table} "
        "--table-md {output.table_md} > {log} 2>&1"


rule sft_rl_aggregate:
    input:
        SFT_RL_BASE_RUNS + SFT_RL_RUNS,
    output:
        f"{SFT_RL_ROOT}/aggregate.csv",
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "aggregate"),
        scale=SCALE,
    log:
        f"{SFT_RL_ROOT}/logs/aggregate.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("sft_rl_aggregate"),
    shell:
        "{params.gf} sft-rl-aggregate --cfg {params.cfg} --scale {params.scale} --runs {input} --out {output} "
        "> {log} 2>&1"


rule sft_rl_tables:
    input:
        f"{SFT_RL_ROOT}/aggregate.csv",
    output:
        main_csv=SFT_RL_TABLES["main_csv"],
        main_md=report(SFT_RL_TABLES["main_md"], category="sft_rl"),
        abl_csv=SFT_RL_TABLES["abl_csv"],
        abl_md=report(SFT_RL_TABLES["abl_md"], category="sft_rl"),
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "tables"),
    log:
        f"{SFT_RL_ROOT}/logs/tables.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("sft_rl_tables"),
    shell:
        "{params.gf} sft-rl-tables --cfg {params.cfg} --aggregate {input} --main-csv {output.main_csv} "
        "--main-md {output.main_md} --abl-csv {output.abl_csv} --abl-md {output.abl_md} > {log} 2>&1"


# SFT-then-RL's start per seed (round 6, issue 59): the start rule's step, val and id accuracy, headroom and the RL
# stage's gain, and whether every seed starts at least 20 id points below the ceiling
rule sft_rl_starts:
    input:
        f"{SFT_RL_ROOT}/aggregate.csv",
    output:
        csv=SFT_RL_STARTS["csv"],
        md=report(SFT_RL_STARTS["md"], category="sft_rl"),
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "tables"),
    log:
        f"{SFT_RL_ROOT}/logs/starts.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("sft_rl_starts"),
    shell:
        "{params.gf} sft-rl-starts --cfg {params.cfg} --aggregate {input} --csv {output.csv} --md {output.md} "
        "> {log} 2>&1"


rule sft_rl_figures:
    input:
        f"{SFT_RL_ROOT}/aggregate.csv",
    output:
        score_vs_flops=report(SFT_RL_FIGURES["score_vs_flops"], category="sft_rl"),
        reward_curves=report(SFT_RL_FIGURES["reward_curves"], category="sft_rl"),
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "figures"),
    log:
        f"{SFT_RL_ROOT}/logs/figures.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("sft_rl_figures"),
    shell:
        "{params.gf} sft-rl-figures --cfg {params.cfg} --aggregate {input} "
        "--score-vs-flops {output.score_vs_flops} --reward-curves {output.reward_curves} > {log} 2>&1"


rule sft_rl_bench:
    # Throughput: round 3's RL and SFT paths against round 4's in one process, and the FLOP floor (bench.py). It
    # needs the machine to itself: run it alone (`snakemake -c1 results/<scale>/bench/sft_rl.json`), or as the last
    # job of the study (it waits for every run, `input.after`).
    input:
        unpack(unless_committed("sft_rl_bench", f"{RESULTS}/bench/sft_rl.json", lambda w: {
            "init": sft_rl_rules.start_of(sft_rl_plan.bench_init_dir(SFT_RL, SFT_RL_ROOT), is_committed),
            "after": SFT_RL_RUNS})),
    output:
        report(f"{RESULTS}/bench/sft_rl.json", category="sft_rl"),
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "bench"),
    log:
        f"{SFT_RL_ROOT}/logs/bench.log",
    conda:
        CONDA_ENV
    threads: max(THREADS, 2)  # the machine to itself (the bench's step runs on SFT_RL.threads)
    resources:
        **rule_resources("sft_rl_bench"),
    shell:
        "{params.gf} sft-rl-bench --cfg {params.cfg} --init $(dirname {input.init}) --out {output} > {log} 2>&1"


if SFT_RL_COMPARE:

    rule sft_rl_compare:
        input:
            aggregate=f"{SFT_RL_ROOT}/aggregate.csv",
            # read when the table is asked for (a checkout without the earlier records still loads and plans)
            records=lambda wildcards: sft_rl_plan.earlier_records(SFT_RL.compare_with.records),
        output:
            csv=SFT_RL_COMPARE["csv"],
            md=report(SFT_RL_COMPARE["md"], category="sft_rl"),
        params:
            gf=GF,
            cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "compare"),
            scale=SCALE,
        log:
            f"{SFT_RL_ROOT}/logs/compare.log",
        conda:
            CONDA_ENV
        threads: 1
        resources:
            **rule_resources("sft_rl_compare"),
        shell:
            "{params.gf} sft-rl-compare --cfg {params.cfg} --scale {params.scale} --aggregate {input.aggregate} "
            "--records {input.records} --csv {output.csv} --md {output.md} > {log} 2>&1"


rule sft_rl_claims:
    input:
        aggregate=f"{SFT_RL_ROOT}/aggregate.csv",
        **SFT_RL_TABLES,
    output:
        f"{RESULTS}/claims/sft_rl.json",
    params:
        gf=GF,
        cfg=sft_rl_rules.job_cfg(SFT_RL_SECTION, "claims"),
        scale=SCALE,
    log:
        f"{SFT_RL_ROOT}/logs/claims.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("sft_rl_claims"),
    shell:
        "{params.gf} sft-rl-claims --cfg {params.cfg} --scale {params.scale} --aggregate {input.aggregate} "
        "--main-csv {input.main_csv} --main-md {input.main_md} --abl-csv {input.abl_csv} --abl-md {input.abl_md} "
        "--out {output} > {log} 2>&1"


rule sft_rl:
    input:
        list(SFT_RL_SELECTION_TABLE.values()) if SFT_RL.lr_selection.enabled else [],
        list(SFT_RL_TABLES.values()),
        list(SFT_RL_FIGURES.values()),
        list(SFT_RL_STARTS.values()),
        list(SFT_RL_COMPARE.values()),
        f"{RESULTS}/claims/sft_rl.json",
        # the bench compares round 3's RL path with the trim: a config without the trim (paper) has nothing to bench
        [f"{RESULTS}/bench/sft_rl.json"] if SFT_RL.rl.length_groups > 0 else [],
