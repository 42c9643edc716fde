# Helpers shared by every rules module: config loading per scale, output roots, the command prefix. No rules here.
import functools
import hashlib
import importlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from snakemake.io import apply_wildcards
from snakemake.utils import update_config
from gradfidelity.config import coerce_cli_strings, validate_section
from gradfidelity.errors import UserError
from gradfidelity.harness import identity as record_identity
from gradfidelity.studies import STUDIES

REPO = Path(workflow.basedir)
SCALE = config["scale"]
# Every scale writes under its own roots, so switching scale never overwrites another scale's outputs
# (the cpu scale's tables, figures and evidence are the artifact's committed reference results).
RESULTS = f"results/{SCALE}"
TABLES = f"paper_tables/{SCALE}"
FIGURES = f"figures/{SCALE}"

# Caches live inside the checkout (ignored by git), never in the user's home.
for _key, _sub in {"TORCH_EXTENSIONS_DIR": "torch_extensions", "MPLCONFIGDIR": "matplotlib",
                   "HF_HOME": "huggingface", "XDG_CACHE_HOME": "xdg"}.items():
    os.environ.setdefault(_key, str(REPO / ".cache" / _sub))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# DeepSpeed's accelerator is set by each job itself (harness/environment.py, from GRADFIDELITY_SCALE below).
# Jobs run side by side, each its own one- or two-rank process group: an inherited MASTER_PORT would make them all
# rendezvous on one port (EADDRINUSE). Every job picks a free port of its own instead.
for _key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
    os.environ.pop(_key, None)


def _load_study_config(study):
    """config/<scale>/<study>.yaml, then --configfile / --config overrides merged key by key at every depth,
    validated by workflow/schemas/<study>.schema.yaml (a wrong key at any depth fails before any job)."""
    path = REPO / "config" / SCALE / f"{study}.yaml"
    if not path.exists():
        raise UserError(f"missing study config {path.relative_to(REPO)} for scale '{SCALE}'")
    schema_path = REPO / "workflow" / "schemas" / f"{study}.schema.yaml"
    override = config.get(study) or {}
    if not isinstance(override, dict):
        raise UserError(f"bad config key '{study}': an override must be a mapping, got {override!r}")
    schema = yaml.safe_load(schema_path.read_text())
    override = coerce_cli_strings(override, schema, study)
    section = yaml.safe_load(path.read_text()) or {}
    update_config(section, override)  # Snakemake's own recursive merge: key by key at every depth
    config[study] = section
    validate_section(config[study], schema_path, study)


for _study in STUDIES:
    _load_study_config(_study)

# The Makefile's .venv is the supported environment (README, CONTRIBUTING): --use-conda would run the same
# commands with another interpreter that has no gradfidelity installed, so it is refused instead of half-working.
if "conda" in {str(m).lower().split(".")[-1] for m in workflow.deployment_settings.deployment_method}:
    raise UserError("--use-conda / --sdm conda is not supported: run `make setup` and use the .venv's snakemake")

# What each rule asks a scheduler for (memory, wall time; GPUs, CPUs and partitions at the paper scale) lives in one
# place per scale: config/<scale>/resources.yaml, one entry per rule; schema: workflow/schemas/resources.schema.yaml.
_RESOURCES_PATH = REPO / "config" / SCALE / "resources.yaml"
if not _RESOURCES_PATH.exists():
    raise UserError(f"missing config/{SCALE}/resources.yaml (what each rule asks a scheduler for at this scale)")
SCALE_RESOURCES = yaml.safe_load(_RESOURCES_PATH.read_text()) or {}
validate_section(SCALE_RESOURCES, REPO / "workflow" / "schemas" / "resources.schema.yaml",
                 f"config/{SCALE}/resources.yaml")
SCALE_RESOURCES = SCALE_RESOURCES["rules"]


def rule_resources(name, **derived):
    """`resources: **rule_resources("<rule>")`: the rule's entry of config/<scale>/resources.yaml. `derived` holds
    what follows from the study's config rather than from the scale (the SFT and RL rules' GPU count is one per
    rank, sft_rl.ranks), so the two cannot disagree. A GPU count of 0 is dropped: no job asks for a GPU where its
    scale needs none."""
    if name not in SCALE_RESOURCES:
        raise UserError(f"config/{SCALE}/resources.yaml has no entry for rule '{name}'")
    merged = {**SCALE_RESOURCES[name], **derived}
    if not merged.get("gpu"):
        merged.pop("gpu", None)
    return merged


def check_cluster_resources():
    """Called at the end of the Snakefile: config/<scale>/resources.yaml names only rules that exist or that a plan
    could create (a typo would otherwise be ignored silently), and every rule that runs a job has an entry."""
    names = {r.name for r in workflow.rules}
    # a study's rule that this plan does not create (study C's job group without cells) is still a rule name
    possible = {n for s in STUDIES for n in getattr(study_module(s, "rules"), "POSSIBLE_RULES", ())}
    unknown = sorted(set(SCALE_RESOURCES) - names - possible)
    if unknown:
        raise UserError(f"config/{SCALE}/resources.yaml names rules that do not exist: {', '.join(unknown)}")
    missing = sorted(names - set(SCALE_RESOURCES) - {"all"} - {r.name for r in workflow.rules if not r.shellcmd})
    if missing:
        raise UserError(f"config/{SCALE}/resources.yaml has no entry for the rules {', '.join(missing)}")


def check_slurm_account():
    """Called on start (the Snakefile's onstart): under the SLURM executor, a job is never submitted under a guessed
    account. The plugin would otherwise guess one with sacctmgr, or go on without."""
    if getattr(workflow.executor_plugin, "name", None) != "slurm":
        return
    if getattr(workflow.executor_settings, "no_account", False):
        return
    defaults = workflow.resource_settings.default_resources
    account = defaults.get("slurm_account") if defaults is not None else None
    raw = str(getattr(account, "raw", "") or "").strip("'\" ")
    if not raw or raw.startswith("EDIT"):
        raise UserError("no SLURM account set: edit slurm_account in workflow/profiles/slurm/config.yaml (or pass "
                        "--default-resources slurm_account=NAME after the targets); on a cluster without accounts, "
                        "pass --slurm-no-account")


THREADS = config["threads"]
# The package, run by the interpreter that runs Snakemake. Inside the checkout it is named relative to it, so a
# moved or fresh clone sees unchanged shell commands and does not rerun finished jobs.
_PY = Path(sys.executable)
_PY = _PY.relative_to(REPO) if _PY.is_relative_to(REPO) else _PY
# GRADFIDELITY_SCALE: the harness records it in every metrics.json and provenance.json.
GF_PY = f"GRADFIDELITY_SCALE={SCALE} {shlex.quote(str(_PY))}"
GF = f"{GF_PY} -m gradfidelity"


_SAID_MISSING: set = set()  # given LR selections that are missing, said once each


def given_lr_selection(produced):
    """input path of the LR selection a study's tuned cells read: `produced` (the study's selection rule's output,
    results/<scale>/<study>/lr_selection.json), or with config `lr_selection_from` set, the same file under that
    folder, taken as given. An absolute path no rule of this workflow writes, so the grid and selection behind it
    stay out of the DAG (Snakemake would rerun them first, since its checkpoints keep them in any DAG that reads
    the selection rule's output)."""
    if not config["lr_selection_from"]:
        return produced
    given = Path(config["lr_selection_from"]).resolve() / Path(produced).relative_to(RESULTS)
    if not given.is_file() and str(given) not in _SAID_MISSING:
        _SAID_MISSING.add(str(given))
        # Said as the workflow loads; a cell that reads it then stops the plan (a missing input no rule makes),
        # naming the file, while the other study's cells plan (study B's round-6 selection is not run yet, issue 60)
        print(f"[gradfidelity] config lr_selection_from={config['lr_selection_from']!r}: no LR selection {given} (a "
              f"results folder of scale '{SCALE}' with <study>/lr_selection.json): a cell that reads it cannot be "
              "planned", file=sys.stderr)
    return str(given)


# Prefix for runs that need deepspeed 0.18.9: the overlay first on PYTHONPATH, the rest of the stack unchanged.
DS0189_ENV = "PYTHONPATH={}${{PYTHONPATH:+:$PYTHONPATH}}".format(shlex.quote(config["deepspeed_buggy_overlay"]))
# Every rule declares it for `snakemake --lint`; it is refused above at run time (see envs/README.md).
CONDA_ENV = "../../envs/gradfidelity.yaml"

# Filled by the study modules: their claim-evidence files and the tables/figures shown in the report.
CLAIM_EVIDENCE = []
REPORT_TARGETS = []
# study -> every training run's metrics.json (the inputs of its runs table, results/<scale>/runs/<study>.csv).
STUDY_RUNS = {}


def study_runs(wildcards):
    """input function of `runs_table`: the metrics.json files of one study (a list, or an input function of its own
    where a study's runs depend on a checkpoint)."""
    runs = STUDY_RUNS[wildcards.study]
    return runs(wildcards) if callable(runs) else runs


def study_root(study):
    """params function: results/<scale>/<study>, read off the job's first output (not hard-coded, so the rule works
    wherever Snakemake stages the outputs)."""

    def _root(wildcards, output):
        first = str(output[0])
        return first[: first.index(f"/{study}/") + len(study) + 1]

    return _root



def cell_json(wildcards):
    """params function of every training rule: the job's wildcards as shell-quoted JSON for `--cell`, written into
    the run's records by the harness (aggregates read a run's identity there, never from its path)."""
    return shlex.quote(json.dumps(dict(wildcards.items()), sort_keys=True))


def _committed_files():
    """The files under results/<scale>/ that git tracks (a run's committed records among them), or None outside a git
    checkout (a release tarball: every record present counts as committed)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", RESULTS], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return frozenset(p for p in listed.split("\0") if p)


COMMITTED = _committed_files()


def is_committed(path):
    """True for a record that is present and committed (harness/records.py: a run's metrics.json, provenance.json
    and benchmark.tsv, committed with the cpu scale)."""
    return Path(REPO, path).is_file() and (COMMITTED is None or str(path) in COMMITTED)


def _standing(value, wildcards):
    """A committed record's inputs: each one there marked ancient(), each one missing left out (a replay, a model,
    prepared data: what a committed run does not need again). A path may still hold the job's wildcards."""
    if isinstance(value, dict):
        kept = {k: _standing(v, wildcards) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, [])}
    if isinstance(value, (list, tuple)):
        return [v for v in (_standing(x, wildcards) for x in value) if v not in (None, [])]
    path = apply_wildcards(str(value), wildcards)
    return ancient(path) if Path(REPO, path).exists() else None


def is_forced(rule, path):
    """True when this run asks for the job again: --forceall, --forcerun <its rule or its output>, or --force on it
    as a target."""
    settings = workflow.dag_settings
    asked = {str(x) for x in settings.forcerun} | ({str(x) for x in settings.targets} if settings.forcetargets else set())
    return settings.forceall or rule in asked or path in asked


# A present record whose identity (harness/identity.py) differs from its job's now is planned again like a new cell:
# its job also reads a marker file written as the workflow plans, naming the record and the reason, so that
# Snakemake reruns it whatever the file times say ("Updated input files: .cache/record-identity/..."); the reason
# is also printed. (A marker made by a job would not do; Snakemake never runs the producer of a missing input of
# a job whose outputs are present.) The marker's name holds the new identity's hash.
STALE_ROOT = f".cache/record-identity/{SCALE}"
STALE_REASONS = {}  # marker key -> (record, reason)
# GRADFIDELITY_BACKFILL_IDENTITY=1 with a dry run writes an identity into each committed record made before round 6
# (computed from the committed config, checked against the config the record kept: `backfill_identity`).
BACKFILL = os.environ.get("GRADFIDELITY_BACKFILL_IDENTITY") == "1"


def _cfg_value(cfg, wildcards):
    """A rule's `--cfg` (a shell-quoted JSON string, or a params function of the wildcards giving one) as a dict."""
    value = cfg(wildcards) if callable(cfg) else cfg
    return json.loads(shlex.split(value)[0]) if isinstance(value, str) else dict(value)


def job_identity(study, job, cfg, data=None):
    """A function of the wildcards: the identity of a job of `study` (kind `job`, e.g. "train") whose `--cfg` is
    `cfg` and whose data identity is `data` (a dict, or a function of the wildcards giving one)."""

    def _identity(wildcards):
        job_name = job(wildcards) if callable(job) else job
        return record_identity.job_identity(study, job_name, _cfg_value(cfg, wildcards),
                                            data(wildcards) if callable(data) else data)

    return _identity


def identity_env(identity):
    """params function of a training rule: `GRADFIDELITY_IDENTITY=<json> `, the prefix that hands the job its
    identity (the harness writes it into provenance.json and into its checkpoints)."""

    def _env(wildcards):
        return f"{record_identity.ENV}={shlex.quote(record_identity.canonical(identity(wildcards)))} "

    return _env


def _stale_marker(path, reason, now):
    """The marker a stale record's job reads (written now, so it is newer than the record), and the printed reason."""
    key = hashlib.sha256(f"{path}\0{now['hash']}".encode()).hexdigest()[:20]
    marker = Path(REPO, STALE_ROOT, f"{key}.txt")
    if key not in STALE_REASONS:
        STALE_REASONS[key] = (path, reason)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{path}: {reason}\n")  # rewritten at every plan: always newer than the record
        try:  # a closed stderr (`2>&1 | head`) must not cost the plan its retrain
            print(f"[gradfidelity] {path}: planned again, {reason}", file=sys.stderr)
        except OSError:
            pass
    return str(marker.relative_to(REPO))


def _with(value, extra):
    if isinstance(value, dict):
        return {**value, "record_changed": extra}
    if isinstance(value, (list, tuple)):
        return [*value, extra]
    return [value, extra] if value else [extra]


@functools.lru_cache(maxsize=1)
def _head_sha():
    """The checkout's commit, asked once per plan (the backfill writes it into every record it gives an identity)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def backfill_identity(path, now):
    """A committed record made before identities (no `identity` in its provenance.json) is given the identity its
    job has under the committed config, marked `backfilled` with how it was checked: every key of the job's config
    section that the record's own `config` kept must be equal there (a restored record, which kept none, says so).
    A disagreement is printed and nothing is written: that record is then planned again."""
    prov_path = Path(REPO, path).parent / "provenance.json"
    prov = json.loads(prov_path.read_text())
    if "identity" in prov:
        return
    kept = record_identity.flatten(prov.get("config") or {})
    wanted = record_identity.flatten(now["config"])
    common = [k for k in wanted if k in kept]
    differ = [f"{k} {kept[k]!r} -> {wanted[k]!r}" for k in common if kept[k] != wanted[k]]
    if differ:
        print(f"[gradfidelity] {path}: not backfilled, its config differs: {'; '.join(differ[:5])}", file=sys.stderr)
        return
    how = (f"the record's own config agrees on all {len(common)} of the {len(wanted)} job keys it kept"
           if kept else "a restored record (it kept no config): taken as made by the committed config, as the round "
                        "that made it committed it")
    prov["identity"] = {**now, "backfilled": f"round 6, from the committed config at {_head_sha()}; {how}"}
    from gradfidelity.harness.io import atomic_write_json

    atomic_write_json(prov_path, prov)


def stale_reason(path, now):
    """Why the present record `path` (a metrics.json) does not stand for the job's identity `now`, or None."""
    was = record_identity.recorded(Path(REPO, path).parent)
    if was is None:
        return "its record carries no identity (made before round 6, or by hand)"
    if was.get("hash") == now["hash"]:
        return None
    return "; ".join(record_identity.differences(was, now)) or f"identity {was.get('hash')} -> {now['hash']}"


def record_stands(path, now):
    """The record `path` (a metrics.json) is there and stands for the job's identity `now`."""
    return Path(REPO, path).is_file() and stale_reason(path, now) is None


def unless_committed(rule, record, inputs, identity=None, records=None):
    """input function of each job that writes a run's record (a training cell, an LR-grid point, a bench):
    `inputs` (a path, list, dict or input function), as they are for a new cell; once the job's `record` (its output
    pattern) is a committed record, each input that is there is marked ancient() and each missing one left out.

    Why: a fresh clone writes every file with the clone's time, in no order a run made them; without this, a
    committed run whose upstream record or LR selection happened to be written a moment later would be retrained,
    and so would every committed run downstream of a cell rebuilt for a new one (Snakemake also dates a job's
    missing output by its dependents' outputs). An ancient input that exists never triggers its job, and a committed
    run does not ask for what it no longer needs (its start's model, prepared data): the record stands until it is
    asked for by name (`--forcerun <its output>` or `--forcerun <rule>`), and then the job reads its inputs as a
    new cell does. A new cell waits for everything it reads.

    `identity` (a function of the wildcards: `job_identity`): a present record stands only for the identity it
    records, its job's config section and data. Otherwise the job is planned like a new cell, waiting for a marker
    that names the keys that differ (`stale_reason`), printed as the workflow plans. `records`: every record the
    job writes (output patterns), where it writes several (study C's paired job: one a method): the backfill gives
    each its identity."""

    def _inputs(wildcards):
        value = inputs(wildcards) if callable(inputs) else inputs
        path = apply_wildcards(record, wildcards)
        if identity is not None and Path(REPO, path).is_file() and not is_forced(rule, path):
            now = identity(wildcards)
            if BACKFILL and is_committed(path):
                for each in ([apply_wildcards(r, wildcards) for r in records] if records else [path]):
                    if is_committed(each):
                        backfill_identity(each, now)
            reason = stale_reason(path, now)
            if reason:
                return _with(value, _stale_marker(path, reason, now))
        if not is_committed(path) or is_forced(rule, path):
            return value
        standing = _standing(value, wildcards)
        return [] if standing is None else standing

    return _inputs


def study_module(study, name):
    """One module of a study's common layout (config, plan, rules, ...), found through the STUDIES registry."""
    return importlib.import_module(f"gradfidelity.studies.{study}.{name}")


def cross_study_input(study, name):
    """A file one study's rules read from another study (e.g. study A's audit reads the sft_rl study's gradient
    alignment run): the owning study names it in its `rules.EXPORTS`, so no .smk rebuilds another study's paths and
    no study imports another."""
    return study_module(study, "rules").EXPORTS[name](STUDY_CONFIG[study], RESULTS)


def study_file(value):
    """A config value naming a file: `<study>:<name>` is a file another study exports (its rules.EXPORTS, through
    cross_study_input: the cpu scale's study B names `local:python_docs`), anything else a path as written."""
    study, sep, name = str(value).partition(":")
    if sep and study in STUDIES and name:
        exports = study_module(study, "rules").EXPORTS
        if name not in exports:
            raise UserError(f"{value!r}: study {study} exports no file {name!r} (it exports: {', '.join(exports) or 'none'})")
        return cross_study_input(study, name)
    return value


def study_file_md5(value):
    """The MD5 of the text a config value names (`study_file`): a file another study exports is named by its pinned
    MD5 (its rule checks it; the file may not be built yet), anything else by its bytes."""
    study, sep, name = str(value).partition(":")
    if sep and study in STUDIES and name:
        return study_module(study, "rules").EXPORT_MD5[name]
    if not Path(value).is_file():
        raise UserError(f"{value!r}: no such file (a corpus a study trains on)")
    return record_identity.md5_file(value)


# Every study's typed config, built once when the workflow loads: the cross-field checks a schema cannot express
# (gradfidelity.studies.<study>.config, `__post_init__`) stop a bad config before any job, naming the key. Plans
# are made from these objects; each job's --cfg is cut from the validated section (the study's rules.JOB_KEYS).
STUDY_CONFIG = {_study: study_module(_study, "config").load(config[_study]) for _study in STUDIES}
