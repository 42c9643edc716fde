"""The closed vocabularies of study B, importable without torch (Snakemake reads them at parse time).

`schedule`: where the gradient is evaluated (sync, 2bw, pipedream, pipedream_vsync); `mitigation`: the add-on
(none, error_feedback, taylor, sync_start, sync_cooldown). The same words are config keys, wildcard/path parts
(`schedule~2bw/mitigation~taylor`), table columns and code names.
"""

SCHEDULES = ("sync", "2bw", "pipedream", "pipedream_vsync")
MITIGATIONS = ("none", "error_feedback", "taylor", "sync_start", "sync_cooldown")
OPTIMIZERS = ("adamw", "muon", "soap", "adan", "lion", "mars")
