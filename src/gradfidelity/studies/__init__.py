"""The four study packages. This tuple is the one list of studies: the CLI, the workflow and the claims report
discover them through it (shared code never imports a study by name)."""

STUDIES = ("ds_audit", "sft_rl", "async_pp", "local")
