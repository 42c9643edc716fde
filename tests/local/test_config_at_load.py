"""Study C's config is checked when the workflow loads, before any job: `snakemake -n` refuses a config whose
cross-field checks fail (config.py's `__post_init__`, built by common.smk's STUDY_CONFIG) or whose `source: file`
corpus neither exists nor is made by a rule of the run (local.smk, corpus_check.py), naming the key.

How an override reaches the section (common.smk, `_load_study_config`): config/<scale>/local.yaml is read first,
then the `local:` mapping of a user's --configfile (or --config) is merged into it key by key at every depth. So
`local: {train: {n_layer: 3}}` changes n_layer alone and keeps the scale's other train keys. The dry runs are made
in a copy of the checkout as a fresh clone has it (no results/), so a file a developer's own cpu run has built
cannot hide the missing-input case."""

from __future__ import annotations

import shutil

import pytest
import yaml

from gradfidelity.errors import UserError
from gradfidelity.studies.local.corpus_check import file_sources
from tests._repo_copy import COPY_IGNORE, REPO
from tests._snakemake import smk

PYDOCS = "local/corpus/python-docs-3.11.txt"
SMOKE_PRODUCED = {f"results/smoke/{PYDOCS}": "local_corpus_pydocs"}


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    work = tmp_path_factory.mktemp("clone") / "repo"
    shutil.copytree(REPO, work, ignore=COPY_IGNORE)
    return work


def _refused(clone, tmp_path, override: dict, *config: str) -> str:
    """`snakemake -n local` at the smoke scale with `override` as the user's --configfile: it must fail while the
    workflow loads (no DAG built, no job planned). Returns stdout + stderr."""
    path = tmp_path / "user.yaml"
    path.write_text(yaml.safe_dump(override))
    res = smk("-n", "local", "--configfile", str(path), "--config", "scale=smoke", *config, cwd=clone, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "UserError" in out, out[-3000:]
    assert "Building DAG of jobs" not in out and "Job stats" not in out, out[-3000:]
    assert not (clone / "results").exists()
    return out


@pytest.mark.slow  # a Snakemake dry run each (about 4 s): together they would cost the fast tier ~25 s
@pytest.mark.parametrize("override,keys", [
    ({"local": {"train": {"n_layer": 3, "n_stages": 2}}},
     ("local.train.n_layer=3", "local.train.n_stages=2")),
    ({"local": {"train": {"n_head": 3}}},  # the smoke widths are 32 and 64
     ("local.widths: 32", "local.train.n_head=3")),
    ({"local": {"main_width": 48}},
     ("local.main_width=48", "local.widths=[32, 64]")),
], ids=["n_layer_vs_n_stages", "width_vs_n_head", "main_width_not_in_widths"])
def test_cross_field_check_refuses_the_config_at_load(clone, tmp_path, override, keys):
    out = _refused(clone, tmp_path, override)
    for key in keys:
        assert key in out, out[-3000:]


@pytest.mark.slow  # a Snakemake dry run each (about 4 s): together they would cost the fast tier ~25 s
def test_the_cpu_corpus_at_the_smoke_scale_is_refused_at_load_naming_both_scales(clone, tmp_path):
    """The cpu scale's `local` section (as a user would paste config/cpu/local.yaml under `local:`) at the smoke
    scale: its python_docs is results/cpu/local/corpus/python-docs-3.11.txt, which no smoke-scale rule makes. Before
    this check it surfaced only as a MissingInputException of rule local_data when the DAG was built."""
    cpu = yaml.safe_load((REPO / "config" / "cpu" / "local.yaml").read_text())
    docs = cpu["corpora"]["python_docs"]
    assert docs == {**docs, "source": "file", "path": f"results/cpu/{PYDOCS}"}
    out = _refused(clone, tmp_path, {"local": cpu})
    assert "MissingInputException" not in out
    for text in ("local.corpora.python_docs.path", f"'results/cpu/{PYDOCS}'", "'cpu' scale", "scale 'smoke'",
                 f"results/smoke/{PYDOCS}"):
        assert text in out, (text, out[-3000:])


@pytest.mark.slow  # a Snakemake dry run each (about 4 s): together they would cost the fast tier ~25 s
def test_the_cpu_scale_keeps_its_own_corpus_which_its_rule_makes(clone):
    """The control: at the cpu scale the same path is made by local_corpus_pydocs, so the workflow loads and plans."""
    res = smk("-n", f"results/cpu/{PYDOCS}", "--config", "scale=cpu", cwd=clone, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "local_corpus_pydocs" in out and "UserError" not in out, out[-3000:]


@pytest.mark.slow  # a Snakemake dry run each (about 4 s): together they would cost the fast tier ~25 s
def test_a_file_corpus_that_nothing_makes_is_refused_at_load(clone, tmp_path):
    out = _refused(clone, tmp_path, {"local": {"corpora": {"tinystories": {"source": "file",
                                                                           "path": "data/my_stories.txt"}}}})
    assert "local.corpora.tinystories.path='data/my_stories.txt'" in out and "does not exist" in out, out[-3000:]


# ------------------------------------------------------------------------------------------- the helper itself
def _corpora(**paths) -> dict:
    return {name: {"source": "file", "path": p} for name, p in paths.items()}


def test_helper_accepts_a_produced_or_existing_path_and_skips_other_sources():
    corpora = {**_corpora(enwik8=f"results/smoke/{PYDOCS}"), "tinystories": {"source": "embedded", "path": ""}}
    assert file_sources(corpora, "smoke", SMOKE_PRODUCED, exists=lambda p: False) == [f"results/smoke/{PYDOCS}"]
    mine = _corpora(enwik8="/data/mine.txt", tinystories=f"results/cpu/{PYDOCS}")
    assert file_sources(mine, "smoke", SMOKE_PRODUCED, exists=lambda p: True) == ["/data/mine.txt",
                                                                                  f"results/cpu/{PYDOCS}"]


def test_helper_names_the_key_the_path_and_both_scales():
    with pytest.raises(UserError) as err:
        file_sources(_corpora(enwik8=f"results/cpu/{PYDOCS}"), "smoke", SMOKE_PRODUCED, exists=lambda p: False)
    msg = str(err.value)
    assert msg.startswith(f"local.corpora.enwik8.path='results/cpu/{PYDOCS}'")
    for text in ("'cpu' scale (results/cpu/...)", "scale 'smoke' (it writes under results/smoke/)",
                 f"set it to results/smoke/{PYDOCS} (rule local_corpus_pydocs", "--config scale=cpu"):
        assert text in msg, (text, msg)


def test_helper_other_scale_path_without_a_rule_is_still_named_as_another_scale():
    with pytest.raises(UserError, match=r"local\.corpora\.tinystories\.path='results/paper/x\.txt'.*'paper' scale"
                                        r".*scale 'cpu'") as err:
        file_sources(_corpora(tinystories="results/paper/x.txt"), "cpu",
                     {f"results/cpu/{PYDOCS}": "local_corpus_pydocs"}, exists=lambda p: False)
    assert "set it to" not in str(err.value)  # no rule makes results/cpu/x.txt: no such advice


def test_helper_refuses_a_missing_file_that_no_rule_makes():
    with pytest.raises(UserError, match=r"local\.corpora\.enwik8\.path='results/smoke/local/corpus/mine\.txt' "
                                        r"\(source: file\) does not exist and no rule of this run makes it"):
        file_sources(_corpora(enwik8="results/smoke/local/corpus/mine.txt"), "smoke", SMOKE_PRODUCED,
                     exists=lambda p: False)


def test_helper_refuses_a_produced_file_written_another_way():
    """Snakemake matches an input to a rule's output by the path as written (`./results/...` matches no rule and
    would end in a MissingInputException): the check names the spelling that matches."""
    with pytest.raises(UserError, match=rf"local\.corpora\.enwik8\.path='\./results/smoke/{PYDOCS}'.*rule "
                                        rf"local_corpus_pydocs makes it, but only under the name "
                                        rf"'results/smoke/{PYDOCS}'"):
        file_sources(_corpora(enwik8=f"./results/smoke/{PYDOCS}"), "smoke", SMOKE_PRODUCED, exists=lambda p: False)
