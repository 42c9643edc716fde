# Study A part 2 (sft_rl, arXiv 2604.23747): SFT-then-RL vs mixed-policy methods on fixed and buggy infrastructure,
# TRL SFTTrainer / GRPOTrainer on DeepSpeed ZeRO-2 + CPU optimizer offload.
#   results/<scale>/sft_rl/<model>/base/seed0/                  base model (pretrained on task prompt -> completion pairs), shared
#   results/<scale>/sft_rl/<model>/<variant>/sft/seed<k>/       SFT; ds_bug/both run under {DS0189_ENV}
#   results/<scale>/sft_rl/<model>/<variant>/<method>/seed<k>/  rl, sft_then_rl, luffy, srft, relift, hpt (GRPO-based)
#   results/<scale>/sft_rl/<model>/alignment/seed0/              micro-batch gradient Gram matrices (read by ds_audit A3)
# Checkpoints are shared through rule outputs: every SFT-then-RL reads its SFT run, every method the base model.
from gradfidelity.studies.sft_rl import plan as sft_rl_plan
from gradfidelity.studies.sft_rl.workflow import deepspeed_env as sft_rl_ds_env, job_cfg as sft_rl_job_cfg
from gradfidelity.studies.sft_rl.workflow import gpus as sft_rl_gpus, launcher as sft_rl_launcher
from gradfidelity.studies.sft_rl.workflow import rl_init as sft_rl_rl_init

SFT_RL = config["sft_rl"]
SFT_RL_ROOT = f"{RESULTS}/sft_rl"
# SFT and RL jobs start `ranks` processes (torchrun) and request one GPU per rank at the paper scale.
SFT_RL_LAUNCH = sft_rl_launcher(GF_PY, SFT_RL["ranks"])
SFT_RL_GPUS = sft_rl_gpus(SFT_RL, SCALE)
SFT_RL_RUNS = sft_rl_plan.planned_runs(SFT_RL, SFT_RL_ROOT)
SFT_RL_TABLES = [f"{TABLES}/sft_rl_main.csv", f"{TABLES}/sft_rl_main.md",
                 f"{TABLES}/sft_rl_bug_ablation.csv", f"{TABLES}/sft_rl_bug_ablation.md"]
SFT_RL_FIGURES = [f"{FIGURES}/sft_rl_score_vs_flops.png", f"{FIGURES}/sft_rl_reward_curves.png"]

# The runs table lists every run, the shared base models included (the aggregate reads the SFT and RL runs only).
SFT_RL_BASES = [f"{sft_rl_plan.base_dir(SFT_RL_ROOT, m['name'])}/metrics.json" for m in SFT_RL["models"]]
STUDY_RUNS["sft_rl"] = SFT_RL_BASES + SFT_RL_RUNS
CLAIM_EVIDENCE.append(f"{RESULTS}/claims/sft_rl.json")
REPORT_TARGETS.extend(SFT_RL_TABLES + SFT_RL_FIGURES)


rule sft_rl_base:
    output:
        f"{RESULTS}/sft_rl/{{model}}/base/seed0/metrics.json",
    params:
        gf=GF,
        cfg=sft_rl_job_cfg(SFT_RL, "pretrain"),
    log:
        f"{RESULTS}/sft_rl/logs/{{model}}_base.log",
    benchmark:
        f"{RESULTS}/sft_rl/{{model}}/base/seed0/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL["threads"]
    resources:
        **cluster_resources(
            "sft_rl_base", mem_mb=SFT_RL["slurm"]["mem_mb"], runtime=SFT_RL["slurm"]["runtime_min"]
        ),
    shell:
        "{params.gf} sft-rl-pretrain --cfg {params.cfg} --model {wildcards.model} --out $(dirname {output}) > {log} 2>&1"


rule sft_rl_sft:
    wildcard_constraints:
        variant="fixed|ds_bug|agg_bug|both",
        seed=r"\d+",
    input:
        base=f"{RESULTS}/sft_rl/{{model}}/base/seed0/metrics.json",
    output:
        f"{RESULTS}/sft_rl/{{model}}/{{variant}}/sft/seed{{seed}}/metrics.json",
    params:
        gf=SFT_RL_LAUNCH,
        cfg=sft_rl_job_cfg(SFT_RL, "sft"),
        env=sft_rl_ds_env(SFT_RL, DS0189_ENV, "sft"),
    log:
        f"{RESULTS}/sft_rl/logs/{{model}}_{{variant}}_sft_seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/sft_rl/{{model}}/{{variant}}/sft/seed{{seed}}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL["threads"]
    resources:
        **cluster_resources(
            "sft_rl_sft", mem_mb=SFT_RL["slurm"]["mem_mb"], runtime=SFT_RL["slurm"]["runtime_min"], gpu=SFT_RL_GPUS
        ),
    shell:
        "{params.env} {params.gf} sft-rl-sft --cfg {params.cfg} --model {wildcards.model} --variant {wildcards.variant} "
        "--seed {wildcards.seed} --base $(dirname {input.base}) --out $(dirname {output}) > {log} 2>&1"


rule sft_rl_alignment:
    # Exported for ds_audit's A3: Gram matrices of the per-micro-batch gradients of SFT's first windows at the base model.
    input:
        base=f"{RESULTS}/sft_rl/{{model}}/base/seed0/metrics.json",
    output:
        f"{RESULTS}/sft_rl/{{model}}/alignment/seed0/metrics.json",
    params:
        gf=GF,
        cfg=sft_rl_job_cfg(SFT_RL, "alignment"),
    log:
        f"{RESULTS}/sft_rl/logs/{{model}}_alignment.log",
    benchmark:
        f"{RESULTS}/sft_rl/{{model}}/alignment/seed0/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL["threads"]
    resources:
        mem_mb=SFT_RL["slurm"]["mem_mb"],
        runtime=SFT_RL["slurm"]["runtime_min"],
    shell:
        "{params.gf} sft-rl-alignment --cfg {params.cfg} --model {wildcards.model} --base $(dirname {input.base}) "
        "--out $(dirname {output}) > {log} 2>&1"


rule sft_rl_rl:
    wildcard_constraints:
        variant="fixed|ds_bug|agg_bug|both",
        method="rl|sft_then_rl|luffy|srft|relift|hpt",
        seed=r"\d+",
    input:
        init=sft_rl_rl_init(SFT_RL, SFT_RL_ROOT),
    output:
        f"{RESULTS}/sft_rl/{{model}}/{{variant}}/{{method}}/seed{{seed}}/metrics.json",
    params:
        gf=SFT_RL_LAUNCH,
        cfg=sft_rl_job_cfg(SFT_RL, "rl"),
        env=sft_rl_ds_env(SFT_RL, DS0189_ENV, "rl"),
    log:
        f"{RESULTS}/sft_rl/logs/{{model}}_{{variant}}_{{method}}_seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/sft_rl/{{model}}/{{variant}}/{{method}}/seed{{seed}}/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: SFT_RL["threads"]
    resources:
        **cluster_resources(
            "sft_rl_rl", mem_mb=SFT_RL["slurm"]["mem_mb"], runtime=SFT_RL["slurm"]["runtime_min"], gpu=SFT_RL_GPUS
        ),
    shell:
        "{params.env} {params.gf} sft-rl-rl --cfg {params.cfg} --model {wildcards.model} --variant {wildcards.variant} "
        "--method {wildcards.method} --seed {wildcards.seed} --init $(dirname {input.init}) "
        "--out $(dirname {output}) > {log} 2>&1"


rule sft_rl_aggregate:
    input:
        SFT_RL_RUNS,
    output:
        f"{RESULTS}/sft_rl/aggregate.csv",
    params:
        gf=GF,
        cfg=study_cfg("sft_rl"),
        scale=SCALE,
    log:
        f"{RESULTS}/sft_rl/logs/aggregate.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{params.gf} sft-rl-aggregate --cfg {params.cfg} --scale {params.scale} --runs {input} --out {output} "
        "> {log} 2>&1"


rule sft_rl_tables:
    input:
        f"{RESULTS}/sft_rl/aggregate.csv",
    output:
        main_csv=f"{TABLES}/sft_rl_main.csv",
        main_md=report(f"{TABLES}/sft_rl_main.md", category="sft_rl"),
        abl_csv=f"{TABLES}/sft_rl_bug_ablation.csv",
        abl_md=report(f"{TABLES}/sft_rl_bug_ablation.md", category="sft_rl"),
    params:
        gf=GF,
        cfg=study_cfg("sft_rl"),
    log:
        f"{RESULTS}/sft_rl/logs/tables.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{params.gf} sft-rl-tables --cfg {params.cfg} --aggregate {input} --main-csv {output.main_csv} "
        "--main-md {output.main_md} --abl-csv {output.abl_csv} --abl-md {output.abl_md} > {log} 2>&1"


rule sft_rl_figures:
    input:
        f"{RESULTS}/sft_rl/aggregate.csv",
    output:
        score_vs_flops=report(f"{FIGURES}/sft_rl_score_vs_flops.png", category="sft_rl"),
        reward_curves=report(f"{FIGURES}/sft_rl_reward_curves.png", category="sft_rl"),
    params:
        gf=GF,
        cfg=study_cfg("sft_rl"),
    log:
        f"{RESULTS}/sft_rl/logs/figures.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{params.gf} sft-rl-figures --cfg {params.cfg} --aggregate {input} "
        "--score-vs-flops {output.score_vs_flops} --reward-curves {output.reward_curves} > {log} 2>&1"


rule sft_rl_claims:
    input:
        aggregate=f"{RESULTS}/sft_rl/aggregate.csv",
        main_csv=f"{TABLES}/sft_rl_main.csv",
        main_md=f"{TABLES}/sft_rl_main.md",
        abl_csv=f"{TABLES}/sft_rl_bug_ablation.csv",
        abl_md=f"{TABLES}/sft_rl_bug_ablation.md",
    output:
        f"{RESULTS}/claims/sft_rl.json",
    params:
        gf=GF,
        cfg=study_cfg("sft_rl"),
        scale=SCALE,
    log:
        f"{RESULTS}/sft_rl/logs/claims.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{params.gf} sft-rl-claims --cfg {params.cfg} --scale {params.scale} --aggregate {input.aggregate} "
        "--main-csv {input.main_csv} --main-md {input.main_md} --abl-csv {input.abl_csv} --abl-md {input.abl_md} "
        "--out {output} > {log} 2>&1"


rule sft_rl:
    input:
        SFT_RL_TABLES,
        SFT_RL_FIGURES,
        f"{RESULTS}/claims/sft_rl.json",
