"""Study A, part 2 (arXiv 2604.23747): SFT-then-RL vs mixed-policy methods on fixed and buggy infrastructure.

config.py (typed config) + plan.py / rules.py (runs, paths, per-job keys) -> task.py (verifiable arithmetic task) ->
models.py (tiny Qwen2/Llama, local tokenizer) -> train.py (TRL SFTTrainer / GRPOTrainer on DeepSpeed ZeRO-2 + CPU
offload, inside the harness Run; with evaluate.py, flops.py, callbacks.py) -> aggregate.py (runs -> tidy CSV) ->
tables.py, figures.py, claims.py (with baseline.py, the constant-answer gate).
"""
