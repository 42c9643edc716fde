"""Study A, part 1: does DeepSpeed hand the optimizer every micro-batch, with the right weight?

Modules: `probe` (micro-batch contribution probe, independent of DeepSpeed), `ds_step` (one real DeepSpeed step),
`worker` (many configs per process, several ranks over gloo), `userconfig` (a user's DeepSpeed JSON -> probe
config), `matrix` (the fault matrix, its table and heat map), `loss_agg` (loss-aggregation weighting audit),
`claims` (claim evidence), `cli` (subcommands).
"""
