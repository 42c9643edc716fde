"""Study A, part 1: does DeepSpeed hand the optimizer every micro-batch, with the right weight?

The house's modules (`config`, `plan`, `rules`, `train`, `aggregate`, `claims`, `tables`, `figures`, `cli`) and the
study's own: `case` (one probe case), `probe` (micro-batch contribution probe, independent of DeepSpeed), `ds_step`
(one real DeepSpeed run of a case), `worker` (many cases per process, several ranks over gloo), `prediction` (what
the bug description predicts per row), `loss_agg` (loss-aggregation weighting audit), `alignment` (the "about 2/N"
on real SFT gradients), `audit` + `userconfig` + `versions` (the user's `audit-deepspeed`), `guard` (the Trainer
callback).
"""
