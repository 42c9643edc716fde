"""Load-time check of study C's `source: file` corpora (called from workflow/rules/local.smk). Torch-free.

A `source: file` corpus is an input of the data rule (`local_data`). A path that neither exists nor is made by a
rule of this run would otherwise surface only when Snakemake builds the DAG, as a bare MissingInputException that
names neither the config key nor the reason. The usual cause is a config of another scale used at this one: the
cpu scale's `enwik8` is results/cpu/local/corpus/python-docs-3.11.txt, which only the cpu scale's
`local_corpus_pydocs` makes (every scale writes under results/<scale>/ alone). So the workflow refuses such a path
when it loads, naming the key, the path, the scale the path belongs to and the scale of this run.

A path that exists is accepted whatever folder it is in (the user's own text, or a file another scale has already
made): it is then a plain input, and the data job records its MD5 (and checks `md5` when given).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

from gradfidelity.errors import UserError

_RESULTS_SCALE = re.compile(r"^results/([^/]+)/")


def _norm(path: str) -> str:
    """`path` normalised, relative to the working directory (the checkout) when it lies inside it: the name a rule's
    output would have. (Snakemake itself matches the path as written: `./results/...` matches no rule.)"""
    p, cwd = os.path.normpath(path), os.getcwd()
    return os.path.relpath(p, cwd) if p.startswith(cwd + os.sep) else p


def file_sources(corpora: Mapping[str, Mapping], scale: str, produced: Mapping[str, str],
                 exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """The paths of the `source: file` corpora of `corpora` (the validated `local.corpora` section), in order:
    the inputs of the data rule. Each must exist (relative to the working directory, i.e. the checkout, or
    absolute) or be an output of a rule of this run (`produced`: path -> rule name); otherwise UserError names
    the key `local.corpora.<name>.path`, the path, and, for a path under results/<other scale>/, that scale and
    this run's `scale`."""
    out = []
    wanted = {_norm(p): rule for p, rule in produced.items()}
    for name, entry in corpora.items():
        if not entry or entry.get("source") != "file":
            continue
        path = entry.get("path", "")
        out.append(path)
        if path in produced or exists(path):
            continue
        key = f"local.corpora.{name}.path"
        norm = _norm(path)
        if norm in wanted:  # Snakemake matches an input to a rule's output by the path as written
            raise UserError(f"{key}={path!r} (source: file): rule {wanted[norm]} makes it, but only under the "
                            f"name {norm!r} (a rule's output is matched by its path as written): write that")
        makes = "; ".join(f"rule {rule} makes {p}" for p, rule in wanted.items())
        m = _RESULTS_SCALE.match(norm)
        if m and m.group(1) != scale:
            other = m.group(1)
            same = f"results/{scale}/" + norm[m.end():]
            fixes = [f"run at that scale (--config scale={other})"]
            if same in wanted:  # the same file of this scale has a rule: its path, or the other scale's built first
                fixes = [f"set it to {same} (rule {wanted[same]} makes it at this scale)", *fixes,
                         f"build that file first (snakemake -c1 {norm} --config scale={other})"]
            raise UserError(
                f"{key}={path!r} (source: file) belongs to the {other!r} scale (results/{other}/...), but this run "
                f"is at scale {scale!r} (it writes under results/{scale}/): no rule of the {scale} scale makes "
                f"that file and it does not exist (a {other} config used at the {scale} scale?). To fix: "
                + "; or ".join(fixes))
        raise UserError(
            f"{key}={path!r} (source: file) does not exist and no rule of this run makes it "
            f"(the workflow's working directory is {os.getcwd()}; {makes or 'no rule makes a corpus file'})")
    return out
