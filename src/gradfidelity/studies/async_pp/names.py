"""The closed vocabularies and the optimizer defaults of study B, importable without torch (Snakemake reads them at
parse time).

`schedule`: where the gradient is evaluated (sync, 2bw, pipedream, pipedream_vsync); `mitigation`: the add-on
(none, error_feedback, taylor, sync_start, sync_cooldown); `head`: whether the LM head is tied to the embedding
(tied, untied); `lr`: `tuned` (the LR chosen on the sync schedule, lr_select.py) or a grid point `x<multiplier>` of
the optimizer's default LR. The same words are config keys, wildcard/path parts (`schedule~2bw/mitigation~taylor`),
table columns and code names.
"""

SCHEDULES = ("sync", "2bw", "pipedream", "pipedream_vsync")
MITIGATIONS = ("none", "error_feedback", "taylor", "sync_start", "sync_cooldown")
HEADS = ("tied", "untied")

# The one place of every optimizer's default peak LR and momentum (the centre of the LR grid; the momentum outside
# the momentum sweep). Sources and the other hyperparameters: optimizers.py. Muon's LR is the Moonlight-adjusted
# one (update RMS 0.2 lr at any width, as AdamW's), so it is on AdamW's scale; see optimizers.py.
DEFAULTS = {
    "adamw": {"lr": 2e-3, "momentum": 0.9},
    "muon": {"lr": 2e-3, "momentum": 0.95},
    "soap": {"lr": 3e-3, "momentum": 0.95},
    "adan": {"lr": 2e-3, "momentum": 0.98},
    "lion": {"lr": 4e-4, "momentum": 0.99},
    "mars": {"lr": 3e-3, "momentum": 0.95},
}
OPTIMIZERS = tuple(DEFAULTS)
DTYPE_NAMES = ("float32", "float64")
