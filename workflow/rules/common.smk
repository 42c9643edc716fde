# Helpers shared by every rules module: config loading per scale, paths, the command prefix. No rules here.
import json
import os
import shlex
import sys
from pathlib import Path

import yaml
from gradfidelity.config import validate_section

STUDIES = ["ds_audit", "sft_rl", "async_pp", "local"]
REPO = Path(workflow.basedir)
SCALE = config["scale"]

# Caches live inside the checkout (ignored by git), never in the user's home.
for _key, _sub in {"TORCH_EXTENSIONS_DIR": "torch_extensions", "MPLCONFIGDIR": "matplotlib",
                   "HF_HOME": "huggingface", "XDG_CACHE_HOME": "xdg"}.items():
    os.environ.setdefault(_key, str(REPO / ".cache" / _sub))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Jobs run side by side, each its own one- or two-rank process group: an inherited MASTER_PORT would make them all
# rendezvous on one port (EADDRINUSE). Every job picks a free port of its own instead.
for _key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
    os.environ.pop(_key, None)


def _load_study_config(study):
    """config/<scale>/<study>.yaml -> config[study], validated by workflow/schemas/<study>.schema.yaml.

    A key given on the command line (--config <study>='{...}') wins over the file, key by key.
    """
    path = REPO / "config" / SCALE / f"{study}.yaml"
    if not path.exists():
        return
    section = yaml.safe_load(path.read_text()) or {}
    section.update(config.get(study) or {})
    config[study] = section
    schema = f"workflow/schemas/{study}.schema.yaml"
    if (REPO / schema).exists():
        validate_section(config[study], REPO / schema, study)


for _study in STUDIES:
    _load_study_config(_study)

THREADS = config["threads"]
# The package, run by the interpreter that runs Snakemake (the project's .venv), whatever PATH says.
GF = f"{shlex.quote(sys.executable)} -m gradfidelity"
# Prefix for runs that need deepspeed 0.18.9: the overlay first on PYTHONPATH, the rest of the stack unchanged.
DS0189_ENV = "PYTHONPATH={}${{PYTHONPATH:+:$PYTHONPATH}}".format(
    shlex.quote(str(REPO / config.get("deepspeed_buggy_overlay", ".venv-ds0189")))
)
# For conda users; the Makefile's .venv is the tested path (see envs/README.md).
CONDA_ENV = "../../envs/gradfidelity.yaml"

# Filled by the study modules: their claim-evidence files and the tables/figures shown in the report.
CLAIM_EVIDENCE = []
REPORT_TARGETS = []


def study_cfg(study, *keys):
    """One study's config section (or a sub-key) as a shell-quoted JSON string for `--cfg {params.cfg}`."""
    node = config[study]
    for key in keys:
        node = node[key]
    return shlex.quote(json.dumps(node, sort_keys=True))
