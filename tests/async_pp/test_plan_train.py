"""Plan, the rules' per-job config, LR selection, the EF recovery formula, a killed-and-resumed training run, CLI
errors (claims, tables and aggregation: test_claims.py; the typed config: test_config.py)."""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import yaml

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp import delay as delay_mod
from gradfidelity.studies.async_pp.config import DEFAULTS, OPTIMIZERS, load
from gradfidelity.studies.async_pp.lr_select import (
    choose,
    extension,
    extension_round,
    select,
    tuned_lr,
    write_selection,
)
from gradfidelity.studies.async_pp.optimizers import REGISTRY
from gradfidelity.studies.async_pp.pairing import ef_recovery
from gradfidelity.studies.async_pp.plan import (
    OWN,
    PATTERN,
    TUNED,
    WIDTH_PREFIX,
    WILDCARDS,
    Cell,
    arm_keys,
    cell_from_wildcards,
    cells,
    default_momentum,
    f_keys,
    grid_cells,
    lr_keys,
    secondary_optimizers,
    sweep_optimizers,
    width_arm_keys,
)
from gradfidelity.studies.async_pp.rules import JOB_KEYS, job_cfg, lr_arg, train_cfg, train_input
from gradfidelity.studies.async_pp.tables import write_lr_selection
from gradfidelity.studies.async_pp.train import eval_steps, run_cell
from tests.async_pp._cfg import SCHEMA_PATH, SMOKE, study, validated

CFG = study()
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())


def test_plan_dedupes_shared_cells_and_paths_and_wildcards_agree():
    cs = cells(CFG)
    assert len(cs) == len(set(cs))
    main = {(c.optimizer, c.schedule, c.mitigation) for c in cs if c.lr in (TUNED, OWN) and c.depth == 1}
    assert ("muon", "2bw", "error_feedback") in main and ("adamw", "sync", "none") in main
    c = Cell("muon", TUNED, "tied", "2bw", "taylor", 1, 0.95, 160, 0)
    assert c.dir() == ("results/async_pp/optimizer~muon/lr~tuned/head~tied/schedule~2bw/mitigation~taylor/depth~1/"
                       "momentum~0.95/steps~160/seed0")
    for cell in cs:  # the rule's output for a cell's wildcards is the cell's path; the wildcards give the cell back
        pattern = (WIDTH_PREFIX if cell.width else "") + PATTERN  # the width ladder's rule (async_pp_train_width)
        assert f"root/{pattern.format(**cell.wildcards())}" == cell.metrics("root")
        assert cell_from_wildcards(cell.wildcards()) == cell
    wc = dict(optimizer="adamw", lr="x0.5", head="tied", schedule="sync", mitigation="none", depth="1",
              momentum="0.9", steps="120", seed="100")
    assert PATTERN.format(**wc).startswith("optimizer~adamw/lr~x0.5/")
    assert cell_from_wildcards(wc) == Cell("adamw", "x0.5", "tied", "sync", "none", 1, 0.9, 120, 100)


def test_mitigations_and_depths_train_at_twice_the_budget_where_at_2T_asks():
    """The budget rule reads B5, B6 and B9 at T and 2T (issue 47): with at_2T (the default) every mitigated and
    every PipeDream cell trains at both budgets; with at_2T false (round 4's cpu runs) at T only."""
    T = CFG.train.steps

    def budgets(cfg):
        cs = [c for c in cells(cfg) if c.lr == OWN and c.seed == 0]
        return ({c.steps for c in cs if c.mitigation != "none"}, {c.steps for c in cs if c.schedule == "pipedream"})

    assert CFG.sweeps.mitigation.at_2T and CFG.sweeps.depth.at_2T
    assert budgets(CFG) == ({T, 2 * T}, {T, 2 * T})
    section = copy.deepcopy(SMOKE)
    section["sweeps"]["mitigation"]["at_2T"] = False
    section["sweeps"]["depth"]["at_2T"] = False
    assert budgets(study(section)) == ({T}, {T})


def test_lr_grid_covers_every_arm_on_a_seed_outside_the_evaluation_seeds():
    """Issue 37: sync, 2bw and the depth sweep's PipeDream at each depth each get a grid of their own."""
    grid = grid_cells(CFG)
    assert {c.seed for c in grid} == {SMOKE["lr_selection"]["seed"]} and {c.mitigation for c in grid} == {"none"}
    keys = lr_keys(CFG)
    assert ("adamw", 0.95) in keys and ("muon", 0.9) in keys and ("lion", 0.99) in keys
    # every optimizer of smoke's sweeps at its default momentum; its momentum sweep adds adamw 0.95 and muon 0.9
    assert len(keys) == len(sweep_optimizers(load(SMOKE))) + 2
    arms = arm_keys(CFG)
    depth = CFG.sweeps.depth
    assert len(arms) == 2 * len(keys) + len(depth.optimizers) * len(depth.depths) * len(depth.schedules)
    assert ("muon", 0.9, "2bw", 1) in arms and ("adamw", 0.9, "pipedream", 4) in arms
    widths = width_arm_keys(CFG)  # each width of the width ladder: its optimizers' sync and 2bw (issue 60)
    assert len(widths) == 2 * sum(len(w.optimizers) for w in CFG.sweeps.width.widths)
    assert len(grid) == (len(arms) + len(widths)) * len(SMOKE["lr_selection"]["multipliers"])
    assert {c.steps for c in grid if c.width} == {w.steps for w in CFG.sweeps.width.widths}
    assert {(c.schedule, c.head) for c in grid if c.schedule == "pipedream"} == {("pipedream", "untied")}
    assert {c.depth for c in grid if c.schedule == "pipedream"} == set(depth.depths)
    # outside the grid: tuned and own only (smoke lists no near-tie arm; the next test adds one)
    assert all(c.lr in (TUNED, OWN) for c in cells(CFG) if c not in grid)
    assert all(c.lr == TUNED for c in cells(CFG) if c.schedule == "sync" and c not in grid)
    ext = grid_cells(CFG, [{"optimizer": "adan", "momentum": 0.98, "multiplier": 8.0},
                           {"optimizer": "muon", "momentum": 0.95, "schedule": "pipedream", "depth": 2,
                            "multiplier": 0.25}])
    assert [(c.optimizer, c.lr, c.momentum, c.schedule, c.depth) for c in ext] == [
        ("adan", "x8", 0.98, "sync", 1), ("muon", "x0.25", 0.95, "pipedream", 2)]
    with pytest.raises(UserError, match="own LR is lr~tuned"):
        Cell("adamw", OWN, "tied", "sync", "none", 1, 0.9, 60, 0)


def test_every_f_key_gets_the_ladder_and_2bw_at_the_main_budget_and_twice_it():
    """The ladder trains at sync's LR; 2bw at T and 2T at its own LR, and at the sync-tuned LR too (the secondary
    column) for the length table's optimizers at their default momentum; mitigations and PipeDream at their own,
    at T and 2T."""
    T = CFG.train.steps
    cs = [c for c in cells(CFG) if not c.width and c.seed < CFG.seeds]  # the model's own width, every sweep's seeds
    both = set(secondary_optimizers(CFG))
    for opt, mom, head in f_keys(CFG):
        def mine(lr, schedule, key=(opt, mom, head)):
            return {c.steps for c in cs if (c.optimizer, c.momentum, c.head, c.mitigation, c.lr, c.schedule)
                    == (*key, "none", lr, schedule)}
        assert set(CFG.sweeps.ladder.of(opt)) <= mine(TUNED, "sync"), (opt, mom)
        assert {T, 2 * T} <= mine(OWN, "2bw"), (opt, mom)
        secondary = opt in both and mom == default_momentum(opt) and head == "untied"
        assert ({T, 2 * T} <= mine(TUNED, "2bw")) == secondary, (opt, mom, head)
    for lr in (OWN, TUNED):
        assert {c.steps for c in cs if c.schedule == "2bw" and c.optimizer == "muon" and c.mitigation == "none"
                and c.momentum == 0.95 and c.lr == lr} == {*CFG.sweeps.length.steps, T, 2 * T}
    assert {c.steps for c in cs if c.mitigation != "none"} == {T, 2 * T}  # at_2T (the budget rule)
    grid = set(grid_cells(CFG))
    assert {c.lr for c in cs if (c.mitigation != "none" or c.schedule == "pipedream") and c not in grid} == {OWN}


def test_depth_sweep_unties_the_head():
    assert all(c.head == "untied" for c in cells(CFG) if c.schedule.startswith("pipedream"))
    tied = study({**SMOKE, "model": {**SMOKE["model"], "tie_embeddings": True}})
    untied = [c for c in cells(tied) if c.head == "untied"]
    assert {c.schedule for c in untied} == {"sync", "2bw", "pipedream"}  # its own ladder where the main is tied
    assert {c.steps for c in untied if c.schedule == "sync"} == set(tied.sweeps.ladder.steps)


def test_optimizer_names_are_defined_once():
    """Every place that names the optimizers agrees with config.OPTIMIZERS: the schema's enum, the optimizer
    registry, the training rule's wildcard constraint; and a cell's default momentum is config.DEFAULTS'."""
    assert SCHEMA["definitions"]["optimizer_name"]["enum"] == list(OPTIMIZERS)
    assert tuple(REGISTRY) == OPTIMIZERS
    assert [o for o in (*OPTIMIZERS, "sgd", "adam") if re.fullmatch(WILDCARDS["optimizer"], o)] == list(OPTIMIZERS)
    assert all(default_momentum(o) == DEFAULTS[o]["momentum"] == REGISTRY[o].momentum for o in OPTIMIZERS)


def test_lr_selection_rule():
    assert choose({0.5: 2.0, 1.0: 1.5, 2.0: 1.7}) == 1.0
    assert choose({0.5: 1.5, 1.0: 1.5}) == 0.5  # a tie goes to the smaller LR
    assert choose({0.5: 2.0, 4.0: math.nan}) == 0.5  # diverged excluded
    with pytest.raises(UserError, match="every grid point diverged"):
        choose({1.0: math.nan})


def _grid_run(tmp_path, opt, mult, loss, scale="smoke", momentum=None, schedule="sync", depth=1):
    mom = DEFAULTS[opt]["momentum"] if momentum is None else momentum
    head = "untied" if schedule == "pipedream" else "tied"
    c = Cell(opt, f"x{mult:g}", head, schedule, "none", depth, mom, 120, 100)
    d = tmp_path / f"run{len(list(tmp_path.iterdir()))}"  # any directory: the cell is read from the records
    d.mkdir(parents=True)
    rec = ({"status": "ok", "metrics": {"final_val_loss": loss}} if math.isfinite(loss)
           else {"status": "diverged", "metrics": {"diverged_at_step": 3}})
    cell = {"study": "async_pp", **c.wildcards()}
    (d / "metrics.json").write_text(json.dumps({**rec, "timing": {}, "scale": scale, "seed": 100, "cell": cell}))
    return str(d / "metrics.json")


def _choice(doc, opt, mom=None, schedule="sync", depth=1):
    mom = DEFAULTS[opt]["momentum"] if mom is None else mom
    return next(c for c in doc["choices"] if (c["optimizer"], c["momentum"], c["schedule"], c["depth"])
                == (opt, mom, schedule, depth))


def test_select_reads_the_grid_and_tuned_lr_reads_the_choice(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    paths = [_grid_run(runs, "adamw", 0.5, 2.0), _grid_run(runs, "adamw", 1, 1.8),
             _grid_run(runs, "adamw", 2, math.nan), _grid_run(runs, "muon", 0.5, 1.2),
             _grid_run(runs, "muon", 1, 1.3), _grid_run(runs, "muon", 2, 1.4),
             _grid_run(runs, "muon", 0.5, 1.5, momentum=0.8), _grid_run(runs, "muon", 1, 1.4, momentum=0.8),
             _grid_run(runs, "muon", 2, 1.45, momentum=0.8)]
    doc = select(paths, "smoke", [0.5, 1, 2])
    assert _choice(doc, "adamw")["multiplier"] == 1 and _choice(doc, "adamw")["bracketed"]
    assert _choice(doc, "muon")["lr"] == pytest.approx(0.5 * DEFAULTS["muon"]["lr"])
    assert _choice(doc, "muon")["at_grid_edge"] and not _choice(doc, "muon")["bracketed"]
    assert _choice(doc, "muon", 0.8)["multiplier"] == 1  # each momentum its own LR
    out = tmp_path / "sel.json"
    write_lr_selection(write_selection(paths, "smoke", str(out), [0.5, 1, 2]), str(tmp_path / "lr.csv"))
    assert tuned_lr(str(out), "muon", 0.95) == pytest.approx(1e-3)
    assert tuned_lr(str(out), "muon", 0.8) == pytest.approx(2e-3)
    md = (tmp_path / "lr.md").read_text()
    assert "bracketed" in md and "| muon" in md
    with pytest.raises(UserError, match="no chosen LR for 'lion'"):
        tuned_lr(str(out), "lion", 0.99)
    with pytest.raises(UserError, match="at momentum 0.5"):
        tuned_lr(str(out), "muon", 0.5)
    with pytest.raises(UserError, match="not 'cpu'"):
        select(paths, "cpu")


def test_the_grid_grows_past_a_winning_edge_until_the_optimum_is_bracketed(tmp_path):
    """A made-up loss surface whose optimum (32x) lies far above the configured grid [0.5, 1, 2, 4]: each round adds
    one point 2x past the winning edge, and the rounds stop when the winner has a point on both sides."""
    def loss(m):
        return (math.log2(m) - 5.0) ** 2 + 1.0

    runs = tmp_path / "runs"
    runs.mkdir()
    base = [0.5, 1, 2, 4]
    paths = [_grid_run(runs, "adan", m, loss(m)) for m in base]
    added = []
    for _ in range(10):
        ext = extension_round(paths, "smoke", base, max_extensions=4)["extension"]
        if not ext:
            break
        assert len(ext) == 1 and ext[0]["optimizer"] == "adan"
        added.append(ext[0]["multiplier"])
        paths.append(_grid_run(runs, "adan", ext[0]["multiplier"], loss(ext[0]["multiplier"])))
    assert added == [8, 16, 32, 64]
    doc = select(paths, "smoke", base)
    assert _choice(doc, "adan")["multiplier"] == 32 and _choice(doc, "adan")["bracketed"]
    assert _choice(doc, "adan")["extended"] == [8, 16, 32, 64]
    # the cap: with 2 extensions allowed the winner stays at the edge, and the table says so
    capped = paths[:6]
    assert extension_round(capped, "smoke", base, max_extensions=2)["extension"] == []
    assert not _choice(select(capped, "smoke", base), "adan")["bracketed"]
    # the lower edge grows downwards
    assert extension({0.5: 1.0, 1: 2.0, 2: 3.0}) == [0.25] and extension({0.5: 2.0, 1: 1.0, 2: 3.0}) == []


def test_ef_recovery_formula():
    assert ef_recovery(2.0, 2.2, 2.05) == pytest.approx(75.0)
    assert math.isnan(ef_recovery(2.0, 1.9, 1.95))


def _tiny_cfg():
    section = copy.deepcopy(SMOKE)
    section["train"].update(steps=12, checkpoint_every=4, evals=3, val_batches=2)
    section["sweeps"].update(length={"optimizers": ["muon"], "steps": [6, 12]}, ladder={"steps": [5, 6, 12, 24]})
    section["data"].update(train_chars=20000, val_chars=3000)
    return load(section)


def test_eval_steps_are_evenly_spaced_and_end_at_the_last():
    assert eval_steps(100, 4) == [25, 50, 75, 100] and eval_steps(10, 3) == [3, 6, 9, 10]


def test_killed_and_resumed_run_repeats_exactly(tmp_path, monkeypatch):
    cfg = _tiny_cfg()
    cell = Cell("adamw", "x1", "untied", "pipedream", "none", 4, 0.9, 12, 0)
    ref = json.loads((run_cell(cfg, cell, str(tmp_path / "a"), 1) / "metrics.json").read_text())
    assert ref["metrics"]["lr"] == DEFAULTS["adamw"]["lr"]
    assert 0 < ref["metrics"]["epochs"] < 1
    assert ref["cell"] == {"study": "async_pp", **cell.wildcards()}  # the run carries its identity
    real_step = delay_mod.DelaySimulator.step

    def dying_step(self, t, *a, **k):
        if t == 10:
            raise KeyboardInterrupt("killed")
        return real_step(self, t, *a, **k)

    monkeypatch.setattr(delay_mod.DelaySimulator, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        run_cell(cfg, cell, str(tmp_path / "b"), 1)
    monkeypatch.setattr(delay_mod.DelaySimulator, "step", real_step)
    out = run_cell(cfg, cell, str(tmp_path / "b"), 1)
    got = json.loads((out / "metrics.json").read_text())
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["resumed_from_step"] == 8
    assert got["metrics"] == ref["metrics"]


def test_tuned_cell_trains_at_the_selected_lr_and_refuses_without_it(tmp_path):
    cfg = _tiny_cfg()
    sel = tmp_path / "sel.json"
    sel.write_text(json.dumps({"choices": [{"optimizer": "lion", "momentum": 0.99, "lr": 1.234e-4}]}))
    cell = Cell("lion", TUNED, "tied", "2bw", "none", 1, 0.99, 12, 0)
    got = json.loads((run_cell(cfg, cell, str(tmp_path / "a"), 1, str(sel)) / "metrics.json").read_text())
    assert got["metrics"]["lr"] == 1.234e-4
    with pytest.raises(UserError, match="needs the LR selection"):
        run_cell(cfg, cell, str(tmp_path / "b"), 1)
    with pytest.raises(UserError, match="untied"):
        run_cell(cfg, Cell("adamw", "x1", "tied", "pipedream", "none", 2, 0.9, 12, 0), str(tmp_path / "c"), 1)
    with pytest.raises(UserError, match="delay"):  # a taylor cell not given the `delay` section
        run_cell(replace(cfg, delay=None), Cell("adamw", "x1", "tied", "2bw", "taylor", 1, 0.9, 12, 0),
                 str(tmp_path / "d"), 1)


def test_cli_bad_config_exits_2_before_work(capsys, tmp_path):
    from gradfidelity.cli import main

    cell = Cell("adamw", "x1", "tied", "sync", "none", 1, 0.9, 10, 0).wildcards()
    run = ["--run-dir", str(tmp_path / "run")]
    assert main(["async-pp-train", "--cfg", "{}", *run, "--cell", json.dumps(cell)]) == 2
    assert "needs the section(s) ['model', 'data', 'train']" in capsys.readouterr().err
    cfg = json.dumps(json.loads(yaml.safe_load(job_cfg(validated(), "train"))))
    assert main(["async-pp-train", "--cfg", cfg, *run, "--cell", json.dumps({**cell, "schedule": "3bw"})]) == 2
    assert "3bw" in capsys.readouterr().err
    assert main(["async-pp-train", "--cfg", cfg, *run]) == 2  # no --cell: a run must know its cell
    assert not (tmp_path / "run").exists()


def _wc(lr="tuned", mitigation="none"):
    return SimpleNamespace(lr=lr, mitigation=mitigation)


def _sections(quoted: str) -> dict:
    return json.loads(yaml.safe_load(quoted))  # shlex-quoted JSON: YAML reads the quotes away


def test_rule_params_carry_only_the_sections_a_job_depends_on():
    cfg = validated()
    assert set(_sections(train_cfg(cfg)(_wc()))) == {"model", "data", "train"}  # no bench, sweeps, delay, seeds
    assert set(_sections(train_cfg(cfg)(_wc(mitigation="taylor")))) == {"model", "data", "train", "delay"}
    assert set(_sections(job_cfg(cfg, "bench"))) == {"model", "data", "train", "bench"}
    assert {job: set(_sections(job_cfg(cfg, job))) for job in ("tables", "figures", "claims")} == \
        dict.fromkeys(("tables", "figures", "claims"), {"seeds", "claim_seeds", "lr_selection", "model", "train",
                                                         "sweeps"})
    assert train_input("sel.json", {})(_wc()) == {"selection": "sel.json"}
    assert train_input("sel.json", {})(_wc(lr="x2")) == {}
    data = {"meta": "d/meta.json", "train": "d/train.bin"}
    assert train_input("sel.json", data)(_wc(lr="x2")) == {"data": "d/meta.json"}
    assert lr_arg(_wc(), SimpleNamespace(selection="sel.json")) == "--lr-selection sel.json"
    assert lr_arg(_wc(lr="x2"), SimpleNamespace()) == ""


@pytest.mark.parametrize(("key", "value", "changed"), [
    (("delay", "taylor_lambda"), 3.0, {"train_delay"}),
    (("bench", "steps"), 7, {"bench"}),
    (("sweeps", "momentum", "momenta"), [0.5, 0.9], {"tables", "figures", "claims"}),
    # decides which cells exist (through the plan, not a training job's --cfg); the reports read it (the length
    # table names the grid's budget, lr_selection.steps), so they are rebuilt
    (("lr_selection", "multipliers"), [1, 2], {"tables", "figures", "claims"}),
    (("model", "d_model"), 64, {"train", "train_delay", "tables", "figures", "claims", "bench"}),
    (("data", "bpe_vocab"), 512, {"data", "train", "train_delay", "bench"}),
])
def test_an_edit_changes_the_cfg_of_exactly_the_jobs_that_read_it(key, value, changed):
    """Snakemake reruns a job whose params changed: an edit must change only the --cfg of the jobs reading it."""
    before = validated()
    after = copy.deepcopy(before)
    node = after
    for k in key[:-1]:
        node = node[k]
    node[key[-1]] = value
    assert {job for job in JOB_KEYS if job_cfg(before, job) != job_cfg(after, job)} == changed


def test_near_tie_arm_trains_its_second_lr_at_T_and_2T_and_the_grid_budget_can_stay():
    """Issue 47: a near-tie arm also trains at the grid's best multiplier, on the evaluation seeds at T and 2T; the
    grid's budget is `lr_selection.steps` when set (the kept round-4 selection), else train.steps."""
    T = CFG.train.steps
    near_tie = [{"optimizer": "adamw", "momentum": 0.9, "schedule": "2bw", "depth": 1,
                 "multiplier": 1}]
    tied = load({**SMOKE, "sweeps": {**SMOKE["sweeps"], "near_tie": near_tie}})
    arm = tied.sweeps.near_tie[0]
    second = {c for c in cells(tied) if c.lr == f"x{arm.multiplier:g}" and c.seed < tied.seeds}
    assert {(c.optimizer, c.momentum, c.schedule, c.steps) for c in second} == \
        {(arm.optimizer, arm.momentum, arm.schedule, n) for n in (T, 2 * T)}
    assert {c.seed for c in second} == set(range(tied.seeds))
    assert set(cells(tied)) - set(cells(CFG)) == second  # nothing else is added
    assert {c.steps for c in grid_cells(CFG) if not c.width} == {T}  # each width's grid at its own T
    kept = load({**SMOKE, "lr_selection": {**SMOKE["lr_selection"], "steps": 2 * T, "check_steps": 4 * T}})
    assert {c.steps for c in grid_cells(kept) if not c.width} == {2 * T}
    assert {c for c in cells(kept) if c.seed < kept.seeds} == {c for c in cells(CFG) if c.seed < CFG.seeds}
    with pytest.raises(UserError, match="sweeps.near_tie"):
        load({**SMOKE, "sweeps": {**SMOKE["sweeps"], "near_tie": [
            {"optimizer": "adamw", "momentum": 0.9, "schedule": "pipedream", "depth": 1, "multiplier": 2}]}})
