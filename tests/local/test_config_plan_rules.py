"""The typed config (schema and dataclasses agree; what the schema cannot say is refused, naming the key), the plan
(the cells and run paths of every scale) and the rules (each job's --cfg holds only the keys it reads, so an edit
reruns only the jobs that read it)."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from gradfidelity.config import SCHEMAS, schema_mismatches
from gradfidelity.errors import UserError
from gradfidelity.studies.local import config, plan, rules
from tests.local._config import REPO, section, study


def test_schema_and_dataclasses_agree():
    schema = yaml.safe_load((SCHEMAS / "local.schema.yaml").read_text())
    assert schema_mismatches(config.StudyConfig, schema) == []
    assert set(rules.JOB_KEYS["train"]) | {k for keys in rules.JOB_KEYS.values() for k in keys} <= \
        set(schema["properties"])


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_every_scale_loads(scale):
    cfg = config.load(yaml.safe_load((REPO / "config" / scale / "local.yaml").read_text()))
    assert cfg.train.n_layer % cfg.train.n_stages == 0 and cfg.bench is not None


@pytest.mark.parametrize("top,key", [
    ({"train": {"n_layer": 5, "n_stages": 2, "n_head": 2}}, "local.train.n_layer=5"),
    ({"widths": [32, 64], "main_width": 48}, "local.main_width=48"),
    ({"widths": [18], "main_width": 18, "train": {"n_layer": 2, "n_stages": 2, "n_head": 4}}, "local.widths: 18"),
    ({"methods": ["rgc_async"]}, "local.methods"),
    ({"corpora": {"enwik8": {"source": "file"}}}, "local.corpora.enwik8.path"),
    ({"corpora": {"python_docs": {"source": "embedded"}}}, "local.corpora.python_docs.source"),
    ({"seeds": 5, "power_seeds": 11, "quality_seeds": 11}, "local.quality_seeds=11"),
    ({"seeds": 5, "control_seeds": 3}, "local.control_seeds=3"),
    ({"main_corpus": "tinystories"}, "local.main_corpus='tinystories'"),
])
def test_cross_field_checks_name_the_key(top, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        study(**top)


def test_smoke_plan():
    cfg = config.load(yaml.safe_load((REPO / "config" / "smoke" / "local.yaml").read_text()))
    runs = plan.runs(cfg, "results/smoke")
    # main: enwik8 and tinystories at 64, 2 seeds, 4 methods; side: enwik8 at 32, 2 seeds, 4 methods; power: seed 2
    # at 64 on both corpora, BP and async Broadcast; mechanism: 3 methods x 2 seeds; quality: seed 3 on the main
    # corpus, BP and serial Broadcast; control: thread-matched BP on seeds 2 and 3
    assert len(runs) == 2 * 2 * 4 + 2 * 4 + 2 * 2 + 2 * 3 + 2 + 2 and len(set(runs)) == len(runs)
    assert runs[0] == "results/smoke/local/enwik8/w64/bp/seed0/metrics.json"
    assert runs[-1] == "results/smoke/local/enwik8/w64/bp_tm/seed3/metrics.json"
    gs = plan.groups(cfg)
    main = ("bp", "bp_tm", "broadcast_async", "rgc_async")
    assert {k: g.methods for k, g in gs.items()} == {
        "main": main, "side": main, "power": ("bp", "broadcast_async"),
        "mechanism": ("live_local", "broadcast_serial", "rgc_serial"), "quality": ("bp", "broadcast_serial"),
        "control": ("bp_tm",)}
    assert gs["quality"].cells == (("enwik8", 64, 3),) and gs["control"].values("seed") == [2, 3]
    assert [g.name for g in gs.values() if g.shares_machine] == ["quality"]
    assert plan.memory_runs(cfg, "results/smoke") == ["results/smoke/local/memory/w64/seed0/metrics.json"]


def test_cpu_plan_sizes_each_cell_by_its_claims():
    """The cpu plan of the README: C4 at 118 seeds (BP and Broadcast: async on 0-10, serial on 11-117), the zero-gap
    control on seeds 5-39, C7 at 5 side seeds, C8 and C9 at 13 mechanism seeds (on 11 and 12 serial Broadcast is the
    quality job's); all on the Python-docs text."""
    cfg = config.load(yaml.safe_load((REPO / "config" / "cpu" / "local.yaml").read_text()))
    gs = plan.groups(cfg)
    count = {k: (len(g.cells), g.methods) for k, g in gs.items()}
    assert count == {"main": (5, ("bp", "bp_tm", "broadcast_async", "rgc_async")),
                     "side": (5, ("bp", "broadcast_async")), "power": (6, ("bp", "broadcast_async")),
                     "mechanism": (11, ("live_local", "broadcast_serial", "rgc_serial")),
                     "mechanism_beside_quality": (2, ("live_local", "rgc_serial")),
                     "quality": (107, ("bp", "broadcast_serial")), "control": (35, ("bp_tm",))}
    assert gs["power"].values("seed") == list(range(5, 11)) and gs["side"].values("width") == [32]
    assert gs["quality"].values("seed") == list(range(11, 118)) and gs["control"].values("seed") == list(range(5, 40))
    assert gs["mechanism"].values("seed") == list(range(11))
    assert gs["mechanism_beside_quality"].values("seed") == [11, 12]
    assert {c[0] for g in gs.values() for c in g.cells} == {"python_docs"} and cfg.main_corpus == "python_docs"
    runs = plan.runs(cfg, "results/cpu")
    assert len(runs) == len(set(runs)) == 5 * 4 + 5 * 2 + 6 * 2 + 11 * 3 + 2 * 2 + 107 * 2 + 35
    serial = {r for r in runs if "/broadcast_serial/" in r}
    assert {f"results/cpu/local/python_docs/w64/broadcast_serial/seed{k}/metrics.json" for k in range(118)} == serial


def test_mechanism_seeds_on_quality_seeds_run_only_what_the_quality_job_did_not():
    """Hand-made: mechanism seeds 0-5 against quality seeds 3-6. Seeds 3-5 already get serial Broadcast from their
    quality job, so their mechanism job runs Live Local and RGC alone; no run has two rules; without quality cells
    the mechanism group is whole."""
    sec = dict(widths=[64], main_width=64, seeds=2, power_seeds=3, quality_seeds=7, mechanism_seeds=6,
               mechanism_widths=[64], corpora={"enwik8": {"source": "embedded"}})
    gs = plan.groups(study(**sec))
    assert gs["mechanism"].values("seed") == [0, 1, 2]
    assert gs["mechanism_beside_quality"].values("seed") == [3, 4, 5]
    assert gs["mechanism_beside_quality"].methods == ("live_local", "rgc_serial")
    runs = plan.runs(study(**sec), "r")
    assert len(runs) == len(set(runs))
    assert sum("/broadcast_serial/seed4/" in r for r in runs) == 1
    whole = plan.groups(study(**{**sec, "quality_seeds": 0}))
    assert "mechanism_beside_quality" not in whole and whole["mechanism"].values("seed") == list(range(6))


def test_group_constraints_match_only_their_own_cells():
    """Groups sharing BP are kept apart by width or seed; the regexes Snakemake gets match exactly those values."""
    import re

    cfg = config.load(yaml.safe_load((REPO / "config" / "cpu" / "local.yaml").read_text()))
    gs = plan.groups(cfg)
    for g in gs.values():
        for w, rx in g.constraints.items():
            full = re.compile(rf"(?:{rx})")
            assert all(full.fullmatch(str(v)) for v in g.values(w))
            assert not any(full.fullmatch(str(v)) for v in range(0, 400) if v not in g.values(w))


def test_overlapping_groups_are_refused():
    """A corpus's own seed count above `seeds` puts its main cells on the power cells' seeds: one run, two rules."""
    with pytest.raises(UserError, match="overlap"):
        plan.groups(study(widths=[64], main_width=64, seeds=2, power_seeds=4,
                          corpora={"enwik8": {"source": "embedded"},
                                   "tinystories": {"source": "embedded", "seeds": 4}}))


def test_seeds_per_cell():
    """The corpus's own count, side_seeds away from the main width (capped by the corpus's own count);
    mechanism_seeds for the serial cell."""
    cfg = study(widths=[32, 64], main_width=64, seeds=5, side_seeds=3, mechanism_seeds=2, mechanism_widths=[64],
                corpora={"enwik8": {"source": "embedded"}, "tinystories": {"source": "embedded", "widths": [64],
                                                                         "seeds": 4}})
    cells = [c for g in plan.groups(cfg).values() if g.name != "mechanism" for c in g.cells]
    per = {}
    for corpus, width, _ in cells:
        per[(corpus, width)] = per.get((corpus, width), 0) + 1
    assert per == {("enwik8", 32): 3, ("enwik8", 64): 5, ("tinystories", 64): 4}
    assert len(plan.groups(cfg)["mechanism"].cells) == 2
    assert plan.corpus_widths(cfg) == {"enwik8": (32, 64), "tinystories": (64,)}


def _cfgs(sec: dict) -> dict[str, str]:
    """The --cfg of every job as the rules make it (local_data's: only its corpus's entry)."""
    out = {job: rules.job_cfg(sec, job) for job in rules.JOB_KEYS if job != "data"}
    for corpus in config.CORPORA:
        out[f"data {corpus}"] = rules.data_cfg(sec)(type("W", (), {"corpus": corpus})())
    return out


def _changed(edit: dict) -> set[str]:
    base = section(corpora={"enwik8": {"source": "embedded"}, "tinystories": {"source": "embedded"}})
    before, after = _cfgs(base), _cfgs(section(**{**base, **edit}))
    return {job for job in before if before[job] != after[job]}


def test_an_edit_reruns_only_the_jobs_that_read_it():
    """Snakemake reruns a job whose params changed: the training jobs' --cfg must not move with an analysis key."""
    assert _changed({"margin_pct": 2.0}) == {"tables", "figures", "claims"}
    assert _changed({"equivalence_bpb": 0.01}) == {"tables", "claims"}
    assert _changed({"seeds": 3, "side_seeds": 2, "power_seeds": 6}) == set()  # the plan: more or fewer jobs
    assert _changed({"train": {"n_layer": 2, "n_stages": 2, "n_head": 2, "steps": 7}}) == {"train", "tables", "bench",
                                                                                                 "memory"}
    assert _changed({"corpora": {"enwik8": {"source": "embedded"},
                                 "tinystories": {"source": "embedded", "embedded_bytes": 5}}}) == {"data tinystories"}
    assert _changed({"corpora": {"enwik8": {"source": "embedded"},
                                 "tinystories": {"source": "embedded", "seeds": 1, "widths": [16]}}}) == set()


def test_a_job_cfg_builds_its_typed_config_with_the_rest_none():
    cfg = config.load_job(json.loads(shlex.split(rules.job_cfg(section(), "train"))[0]), "train")
    assert cfg.train.n_layer == 2 and cfg.margin_pct is None and cfg.corpora is None
    with pytest.raises(UserError, match="local.train"):
        config.load_job({"margin_pct": 1.0}, "train")
    data = rules.data_cfg(section())(type("W", (), {"corpus": "enwik8"})())
    corpora = config.load_job(json.loads(shlex.split(data)[0]), "data").corpora
    assert corpora.tinystories is None and corpora.enwik8.source == "embedded" and corpora.enwik8.seeds is None


def test_threads_and_environment():
    cfg = study(train={"n_layer": 4, "n_stages": 4, "n_head": 2, "threads_per_stage": 3,
                       "omp_wait_policy": "PASSIVE"})
    assert rules.threads(cfg, 2) == 12 and rules.threads(cfg, 16) == 16
    # a quality job takes one thread (two at a time) and says so in its command; every other group owns the machine
    gs = plan.groups(study(seeds=1, quality_seeds=3, control_seeds=2))
    assert rules.threads(cfg, 2, gs["quality"]) == 1 and rules.shares_flag(gs["quality"]) == " --shares-machine"
    assert rules.threads(cfg, 2, gs["control"]) == 12 and rules.shares_flag(gs["control"]) == ""
    # a trimmed plan without serial Broadcast (or thread-matched BP) has no quality (or control) cells: no rule
    trimmed = plan.groups(study(seeds=1, quality_seeds=3, control_seeds=2, methods=["bp", "broadcast_async"]))
    assert "quality" not in trimmed and "control" not in trimmed
    assert rules.omp_env(cfg) == "OMP_WAIT_POLICY=PASSIVE " and rules.omp_env(study()) == ""
