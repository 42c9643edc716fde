"""Study B (arXiv 2606.30634): one-step gradient delay (PipeDream-2BW) across six optimizers.

Modules: model (SmolLM-style decoder), data (embedded corpus, FineWeb-Edu loader), optimizers (one registry),
delay (the single-process delay simulator and the mitigations), pipeline (a real multi-process asynchronous
pipeline over gloo), plan (the sweep cells), train (one run through the harness), analysis (tables, figures,
claims), bench (step-cost and pipeline-throughput benchmark), cli.
"""
