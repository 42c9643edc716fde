"""A record stands only for the config and data that made it (harness/identity.py, common.smk's unless_committed).

Unit tests of the identity (hash, harmless keys, the reason's wording), of the harness writing it and refusing a
checkpoint of another identity, and, at the smoke scale end to end, the README's own-text recipe: the user's bytes
are what the run trained on."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gradfidelity.harness import Run
from gradfidelity.harness import identity as ident

REPO = Path(__file__).resolve().parents[1]


def test_the_hash_follows_config_and_data_and_ignores_key_order():
    a = ident.job_identity("local", "train", {"train": {"steps": 2000, "lr": 0.008}}, {"corpus": {"text_md5": "x"}})
    b = ident.job_identity("local", "train", {"train": {"lr": 0.008, "steps": 2000}}, {"corpus": {"text_md5": "x"}})
    assert a["hash"] == b["hash"]
    other_steps = ident.job_identity("local", "train", {"train": {"steps": 100, "lr": 0.008}},
                                     {"corpus": {"text_md5": "x"}})
    other_text = ident.job_identity("local", "train", {"train": {"steps": 2000, "lr": 0.008}},
                                    {"corpus": {"text_md5": "y"}})
    assert len({a["hash"], other_steps["hash"], other_text["hash"]}) == 3


def test_a_harmless_key_is_left_out_and_every_harmless_key_has_a_reason():
    a = ident.job_identity("local", "train", {"train": {"steps": 5, "checkpoint_every": 0}})
    b = ident.job_identity("local", "train", {"train": {"steps": 5, "checkpoint_every": 100}})
    assert a["hash"] == b["hash"] and "checkpoint_every" not in a["config"]["train"]
    # the same key is not harmless in a study that does not declare it
    c = ident.job_identity("ds_audit", "train", {"train": {"steps": 5, "checkpoint_every": 0}})
    d = ident.job_identity("ds_audit", "train", {"train": {"steps": 5, "checkpoint_every": 100}})
    assert c["hash"] != d["hash"]
    for study, keys in ident.HARMLESS.items():
        assert all(len(reason) > 20 for reason in keys.values()), study


def test_the_reason_names_each_key_that_differs_old_to_new():
    old = ident.job_identity("local", "train", {"train": {"steps": 2000, "lr": 0.008}}, {"corpus": {"text_md5": "a"}})
    new = ident.job_identity("local", "train", {"train": {"steps": 100, "lr": 0.008}}, {"corpus": {"text_md5": "b"}})
    assert ident.differences(old, new) == ["config changed: train.steps 2000 -> 100",
                                           "data changed: corpus.text_md5 a -> b"]
    assert ident.differences(old, old) == []
    added = ident.job_identity("local", "train", {"train": {"steps": 2000, "lr": 0.008, "warmup": 10}},
                               {"corpus": {"text_md5": "a"}})
    assert ident.differences(old, added) == ["config changed: train.warmup (none) -> 10"]


def test_md5_file_is_the_file_md5_and_follows_an_edit(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"hello")
    assert ident.md5_file(f) == hashlib.md5(b"hello").hexdigest()
    f.write_bytes(b"hello, world")
    os.utime(f, ns=(1, 1))  # another size and time: read again
    assert ident.md5_file(f) == hashlib.md5(b"hello, world").hexdigest()


def _train(run_dir: Path, steps: int, stop_at: int | None = None) -> None:
    """A tiny run: a linear model, a checkpoint every step; `stop_at` raises there (a killed run)."""
    with Run(run_dir, study="local", config={"steps": steps}, seed=0, threads=1, checkpoint_every=1,
             sample_memory=False) as run:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        start, _ = run.resume({"model": model, "opt": opt})
        for step in range(start, steps):
            if step == stop_at:
                raise KeyboardInterrupt
            loss = model(torch.ones(1, 2)).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.maybe_checkpoint(step + 1, {"model": model, "opt": opt})
        run.finish({"loss": float(loss)})


def test_the_run_records_its_identity_and_never_resumes_another_ones_checkpoint(tmp_path, monkeypatch):
    first = ident.job_identity("local", "train", {"train": {"steps": 4}})
    monkeypatch.setenv(ident.ENV, ident.canonical(first))
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path, 4, stop_at=2)
    assert (tmp_path / "checkpoint.pt").exists()
    # the same identity resumes
    _train(tmp_path, 4)
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["identity"] == first and prov["resumed_from_step"] == 2
    # another identity (the config changed) does not resume: the checkpoint is set aside with the reason
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path, 4, stop_at=2)
    second = ident.job_identity("local", "train", {"train": {"steps": 3}})
    monkeypatch.setenv(ident.ENV, ident.canonical(second))
    _train(tmp_path, 3)
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["identity"]["hash"] == second["hash"] and prov["resumed_from_step"] is None
    assert "another job identity" in prov["checkpoints_discarded"][0]["reason"]


def test_a_run_started_by_hand_records_no_identity(tmp_path, monkeypatch):
    monkeypatch.delenv(ident.ENV, raising=False)
    _train(tmp_path, 2)
    assert "identity" not in json.loads((tmp_path / "provenance.json").read_text())


def _user_text(path: Path, words: list[str], seed: int) -> None:
    rng = random.Random(seed)
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(20000)) + "\n")


# A trimmed smoke plan that still reaches the claims: width 64, 3 paired seeds of BP and async Broadcast (C4's and
# C6's arms), the memory probe, no power, quality, control or mechanism cells.
_TRIM = ("local:\n  widths: [64]\n  seeds: 3\n  power_seeds: 0\n  quality_seeds: 0\n  control_seeds: 0\n"
         "  methods: [bp, broadcast_async]\n")


@pytest.mark.slow
@pytest.mark.e2e
def test_own_text_recipe_trains_on_the_users_bytes_and_the_claims_name_them_at_smoke(tmp_path):
    """The README's own-text recipe, end to end at the smoke scale (issues 56 and 61):
    - a cell made on the scale's own corpus, then the user's file put in the main corpus's place: the plan names why
      the record no longer stands (its text changed), the data meta and the run's identity carry the file's MD5,
      and the metric differs from the first run's;
    - the claims read the user's text: each detail of a claim on the main corpus names the file and its MD5;
    - the C6 recipe in the same run (`tinystories: {source: file, ...}`): C6 is decided on the user's stories, no
      longer "not measured", and its detail names that file and its MD5.
    Nothing plans the Python-docs build."""
    work = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
    text, stories = tmp_path / "mytext.txt", tmp_path / "stories.txt"
    _user_text(text, ["ledger", "quartz", "vellum", "harbour", "cobalt", "meadow", "lantern", "ferrous", "sable"], 7)
    _user_text(stories, ["once", "upon", "a", "time", "little", "dog", "ran", "home", "happy", "sun", "mom"], 8)
    md5 = hashlib.md5(text.read_bytes()).hexdigest()
    md5_stories = hashlib.md5(stories.read_bytes()).hexdigest()
    (tmp_path / "base.yaml").write_text(_TRIM)
    (tmp_path / "my.yaml").write_text(_TRIM + f"  corpora:\n    enwik8: {{source: file, path: {text}, md5: ''}}\n"
                                      f"    tinystories: {{source: file, path: {stories}, md5: ''}}\n")
    cell = "results/smoke/local/enwik8/w64/bp/seed0/metrics.json"
    claims = "results/smoke/claims/local.json"

    def snakemake(configfile, target, *extra):
        res = subprocess.run([sys.executable, "-m", "snakemake", "-c2", target, *extra, "--configfile",
                              str(tmp_path / configfile), "--config", "scale=smoke"], cwd=work, capture_output=True,
                             text=True, timeout=1500)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res

    snakemake("base.yaml", cell)
    theirs = json.loads((work / cell).read_text())["metrics"]
    plan = snakemake("my.yaml", claims, "-n")
    assert f"{cell}: planned again, data changed: " in plan.stderr and f"corpus.text_md5 (none) -> {md5}" in plan.stderr
    assert "local_corpus_pydocs" not in plan.stdout
    snakemake("my.yaml", claims)
    meta = json.loads((work / "results/smoke/local/data/enwik8/meta.json").read_text())
    assert md5 in json.dumps(meta)  # the data job read the user's bytes
    prov = json.loads((work / cell).with_name("provenance.json").read_text())
    assert prov["identity"]["data"]["corpus"]["text_md5"] == md5
    ours = json.loads((work / cell).read_text())["metrics"]
    assert ours["val_bpb"] != theirs["val_bpb"]
    values = json.loads((work / claims).read_text())["values"]
    assert f"enwik8 (file:mytext.txt, MD5 {md5})" in values["C4"]["detail"]
    assert values["C4"]["n"] == 3 and values["C4"]["estimate"] is not None
    c6 = values["C6"]
    assert f"tinystories (file:stories.txt, MD5 {md5_stories})" in c6["detail"], c6["detail"][:300]
    assert c6["n"] == 3 and c6["estimate"] is not None and "not measured" not in c6["detail"]
    shutil.rmtree(work)


def _fake_run(root: Path, seed: int, steps: int) -> str:
    d = root / f"w64/bp/seed{seed}"
    d.mkdir(parents=True)
    cell = {"study": "local", "corpus": "python_docs", "width": "64", "method": "bp", "seed": str(seed)}
    (d / "metrics.json").write_text(json.dumps({"status": "ok", "study": "local", "scale": "cpu", "seed": seed,
                                                "cell": cell, "metrics": {"val_bpb": 2.8}, "timing": {}}))
    identity = ident.job_identity("local", "train", {"train": {"steps": steps}})
    (d / "provenance.json").write_text(json.dumps({"seed": seed, "status": "ok", "identity": identity}))
    return str(d / "metrics.json")


def test_an_aggregate_refuses_two_configs_in_one_cell_naming_both(tmp_path):
    from gradfidelity.errors import UserError
    from gradfidelity.harness.results import load_run_records, runs_table

    same = [_fake_run(tmp_path / "a", k, 2000) for k in range(3)]
    assert len(load_run_records(same, "cpu")) == 3
    table = runs_table(same, "cpu")
    expected = ident.job_identity("local", "train", {"train": {"steps": 2000}})["hash"]
    assert list(table["config_hash"]) == [expected] * 3
    mixed = [_fake_run(tmp_path / "b", 0, 2000), _fake_run(tmp_path / "b", 1, 100)]
    with pytest.raises(UserError, match="two configs or data") as err:
        load_run_records(mixed, "cpu")
    assert expected in str(err.value)
    assert ident.job_identity("local", "train", {"train": {"steps": 100}})["hash"] in str(err.value)


def test_seeds_of_one_cell_from_two_committed_bases_are_strata_not_a_mix(tmp_path):
    """Study A, round 6: seeds start from base k mod 2, so a cell's runs carry two identities, one per base (their
    data's base_seed). Each base is a stratum: two bases pass; two configs on one base are still refused."""
    from gradfidelity.errors import UserError
    from gradfidelity.harness.results import load_run_records

    def run(root, seed, base, steps=2000):
        path = Path(_fake_run(root, seed, steps))
        identity = ident.job_identity("local", "train", {"train": {"steps": steps}}, {"start": "b", "base_seed": base})
        (path.parent / "provenance.json").write_text(json.dumps({"seed": seed, "status": "ok", "identity": identity}))
        return str(path)

    assert len(load_run_records([run(tmp_path / "a", k, k % 2) for k in range(4)], "cpu")) == 4
    with pytest.raises(UserError, match="two configs or data"):
        load_run_records([run(tmp_path / "b", 0, 0), run(tmp_path / "b", 2, 0, steps=100)], "cpu")
