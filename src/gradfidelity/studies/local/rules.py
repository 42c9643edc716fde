"""What workflow/rules/local.smk asks of study C: the config keys each job reads, the
params functions, the wildcard constraints, threads and the environment prefix. Torch-free.

The rules pass each job only the keys it reads (`JOB_KEYS`), as JSON on `--cfg`: Snakemake reruns a job whose
params changed, so editing a key reruns exactly the jobs that read it (an edit of `margin_pct` reruns the tables,
figures and claims, never a training run).
"""

from __future__ import annotations

import json
import shlex

from gradfidelity.studies.local import plan
from gradfidelity.studies.local.config import CORPORA, StudyConfig

# The keys of the `local` section each job reads (its config holds only these; the rest are None there). Jobs:
# data (rule local_data), train (local_main, local_side, local_power, local_mechanism: one paired cell), tables,
# figures, claims, bench, memory (local_memory: C3's probe).
JOB_KEYS = {
    "data": ("corpora",),  # and of it only the job's own corpus (`data_cfg`)
    "train": ("train",),  # the model and optimisation; the cell's data come as an input, its identity as wildcards
    "tables": ("train", "margin_pct", "equivalence_bpb", "memory"),  # train, memory: the notes under the tables
    "figures": ("main_width", "margin_pct"),
    "claims": ("main_width", "margin_pct", "equivalence_bpb", "mechanism_corpora", "mechanism_widths",
               "main_corpus"),
    "bench": ("train", "bench"),
    "memory": ("train", "memory"),  # C3's probe: the training settings at the probe's width and depth
}
# The keys of a corpus entry the data job reads (its widths and seeds are the plan's).
DATA_KEYS = ("source", "path", "embedded_bytes", "split", "md5")
# Global wildcard constraints of the study's rules.
WILDCARDS = {"width": r"\d+", "seed": r"\d+", "corpus": "|".join(CORPORA)}


def job_section(section: dict, job: str) -> dict:
    """The keys of the validated `local` section that `job` reads."""
    return {k: section[k] for k in JOB_KEYS[job] if k in section}


def job_cfg(section: dict, job: str) -> str:
    """`job_section` as a shell-quoted JSON string for `--cfg {params.cfg}`."""
    return shlex.quote(json.dumps(job_section(section, job), sort_keys=True))


def data_cfg(section: dict):
    """params function of local_data: only the job's own corpus entry, and of it only what the data read
    (`DATA_KEYS`), so that editing one corpus's source redoes that corpus's splits (and its training runs) alone,
    and editing its widths or seeds (the plan's) redoes nothing. A corpus without an entry gives an empty mapping:
    the job then names the missing key."""

    def _cfg(wildcards) -> str:
        corpora = job_section(section, "data")["corpora"]
        entry = corpora.get(wildcards.corpus)
        own = {wildcards.corpus: {k: entry[k] for k in DATA_KEYS if k in entry}} if entry is not None else {}
        return shlex.quote(json.dumps({"corpora": own}, sort_keys=True))

    return _cfg


def run_dir(root_of):
    """params function of the training rules: `--run-dir`, the run directory of each method of the cell with
    `{method}` in place of the method (one job writes one run directory per method). `root_of(wildcards, output)`
    gives results/<scale>/local (common.smk's study_root)."""

    def _run_dir(wildcards, output) -> str:
        root = root_of(wildcards, output)
        return shlex.quote(plan.run_dir(root, wildcards.corpus, wildcards.width, "{method}", wildcards.seed))

    return _run_dir


def threads(cfg: StudyConfig, workflow_threads: int, group=None) -> int:
    """A training job owns the machine: throughput is the measurement, so two jobs must never share the cores.
    Except a quality job (`plan.Group.shares_machine`): one thread, two at a time, its throughput never read."""
    if group is not None and group.shares_machine:
        return 1
    return max(workflow_threads, cfg.train.async_threads)


def shares_flag(group) -> str:
    """The local-cell flag that records, in each run's timing, that its job ran beside another."""
    return " --shares-machine" if group.shares_machine else ""


def omp_env(cfg: StudyConfig) -> str:
    """The shell prefix exporting OMP_WAIT_POLICY before the interpreter starts (libgomp reads it once, at load)."""
    policy = cfg.train.omp_wait_policy
    return f"OMP_WAIT_POLICY={policy} " if policy else ""


def group_record(plan_module, results: str, group) -> str:
    """The record that stands for a paired job of `group` (its first method's metrics.json, a pattern with the job's
    wildcards): the workflow's unless_committed reads whether it is committed."""
    return plan_module.run_pattern(results).replace("{method}", group.methods[0])


def corpus_source(section: dict):
    """input function of local_data: the job's own corpus file (a `source: file` corpus), else nothing."""

    def _source(wildcards) -> list[str]:
        entry = section["corpora"].get(wildcards.corpus) or {}
        return [entry["path"]] if entry.get("source") == "file" else []

    return _source


def corpus_identity(section: dict, corpus: str, md5_of=None) -> dict:
    """What a cell's data are (harness/identity.py): the corpus's data settings and its text's MD5: the pinned `md5`
    when the entry gives one (the data job checks it), else the file's own (a user's text). Not its path: the same
    text moved elsewhere is the same data. An embedded corpus is its settings (the text is built in code)."""
    from gradfidelity.harness.identity import md5_file

    entry = section["corpora"].get(corpus) or {}
    own = {k: entry[k] for k in DATA_KEYS if k in entry and k not in ("path", "md5")}
    if entry.get("source") == "file":
        own["text_md5"] = entry.get("md5") or (md5_of or md5_file)(entry["path"])
    return {"corpus": {"name": corpus, **own}}


def train_identity(section: dict):
    """The data identity of a paired training job: its corpus (`corpus_identity`), by the job's wildcards."""
    return lambda wildcards: corpus_identity(section, wildcards.corpus)


def partial_cells(groups, pattern: str, stands) -> list[str]:
    """The cells of `groups` that have the standing records of some of their methods and not of others: a paired
    job writes every method of its cell, so running it would overwrite the records another group made (one more main
    seed is a seed the power and control groups already ran). `stands(path, corpus)`: the record is there and stands
    for the job's identity (a record of another config or text is planned again anyway: a user's own text with a
    trimmed plan overwrites nothing that still counts). One line per cell, naming what it has and what it lacks."""
    out = []
    for g in groups:
        for corpus, width, seed in g.cells:
            have = [m for m in g.methods
                    if stands(pattern.format(corpus=corpus, width=width, method=m, seed=seed), corpus)]
            if have and len(have) < len(g.methods):
                lacks = [m for m in g.methods if m not in have]
                out.append(f"{g.name} cell {corpus} w{width} seed {seed} has {', '.join(have)} (made by another "
                           f"group) and lacks {', '.join(lacks)}")
    return out


# Files other studies' rules read (workflow/rules/common.smk: cross_study_input): name -> f(typed config, results
# root). Study B trains on the same Python-docs text as the cpu scale's main corpus (rule local_corpus_pydocs).
EXPORTS = {
    "python_docs": lambda cfg, results: f"{results}/local/corpus/python-docs-3.11.txt",
}
# The pinned MD5 of each exported text: the rule that builds it checks it, and a study that reads it names its data
# by it (harness/identity.py). Debian's python3.11-doc 3.11.2-6+deb12u9 (docs/sources.md, Study C).
EXPORT_MD5 = {"python_docs": "ffe3fd4a0f5469cba03458a8aed6d3b6"}


# Rules a plan of this study can create (workflow/rules/common.smk: check_cluster_resources). A job group with no
# cells has no rule (a trimmed config: two methods, one width), yet config/<scale>/resources.yaml keeps its entry.
POSSIBLE_RULES = tuple(f"local_{g}" for g in plan.GROUPS)
