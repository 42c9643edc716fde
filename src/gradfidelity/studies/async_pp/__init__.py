"""Study B (arXiv 2606.30634): one-step gradient delay (PipeDream-2BW) across six optimizers.

The house's nine modules: config (the typed section and the closed vocabularies), plan (the sweep cells), rules
(what the .smk asks), train (one cell through the harness), aggregate (run records -> runs.csv, curves.csv), claims
(B1-B9 evidence), tables, figures, cli. Beside them: compute_fraction (the delay as lost compute, f = S*/T, and the
transient gate), pairing (paired-seed look-ups, f per seed, the gate on runs.csv, shared by tables, figures and
claims), lr_select (the LR rule and its grid rounds), model (SmolLM-style decoder), data (embedded corpus, a text file
with its BPE, FineWeb-Edu loader), optimizers (one registry), delay (the single-process delay simulator and the
mitigations), pipeline (a real multi-process asynchronous pipeline over gloo), bench (step-cost and
pipeline-throughput benchmark).
"""
