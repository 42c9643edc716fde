"""A user's DeepSpeed JSON -> probe cases: every key that decides the gradient path is kept, "auto" is explicit."""

import json

import pytest

from gradfidelity.errors import UserError
from gradfidelity.studies.ds_audit.userconfig import load_config, plan_audit

BASE = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "overlap_comm": True, "reduce_bucket_size": "auto"},
}


def _assumed(plan) -> dict:
    return {a["key"]: (a["how"], a["detail"]) for a in plan.assumed}


def test_keeps_the_gradient_path():
    plan = plan_audit(BASE)
    assert [c.role for c in plan.cases] == ["accumulation", "clipping"]
    case = plan.cases[0].case
    assert (case.zero_stage, case.offload, case.ga, case.dtype, case.micro_batch, case.clip) == (2, "cpu", 4, "bf16",
                                                                                               1, 1.0)
    assert case.steps == 3 and case.target_norm == 0.5  # half the threshold: clipping on, never rescaling
    assert plan.cases[1].case.target_norm == 2.0  # the clipping case: twice the threshold
    ds = case.ds_config(world=1)
    assert ds["zero_optimization"]["offload_optimizer"] == {"pin_memory": True, "device": "cpu"}
    assert ds["zero_optimization"]["overlap_comm"] is True
    assert "reduce_bucket_size" not in ds["zero_optimization"]  # "auto": not audited, and listed
    assert "optimizer" not in ds  # the probe's own SGD(lr=1) is the client optimizer
    assert ds["train_batch_size"] == 1 * 4 * 1
    got = _assumed(plan)
    assert got["optimizer"][0] == "not audited" and got["zero_optimization.reduce_bucket_size"][0] == "not audited"


def test_every_ignored_key_is_listed():
    cfg = {**BASE, "scheduler": {"type": "WarmupLR"}, "prescale_gradients": True, "gradient_predivide_factor": 2.0,
           "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"},
           "fp16": {"enabled": False, "loss_scale": 0, "initial_scale_power": 16},
           "zero_optimization": {**BASE["zero_optimization"], "some_new_knob": 1}}
    got = _assumed(plan_audit(cfg))
    for key in ("optimizer", "scheduler", "prescale_gradients", "gradient_predivide_factor",
                "communication_data_type", "data_types", "fp16.loss_scale", "fp16.initial_scale_power",
                "zero_optimization.reduce_bucket_size", "zero_optimization.some_new_knob"):
        assert got[key][0] == "not audited", key


def test_auto_ga_needs_the_flag():
    cfg = {**BASE, "gradient_accumulation_steps": "auto"}
    with pytest.raises(UserError, match="--gradient-accumulation-steps"):
        plan_audit(cfg)
    assert plan_audit(cfg, ga_override=8).cases[0].case.ga == 8


def test_auto_values_are_listed():
    cfg = {**BASE, "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
           "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    plan = plan_audit(cfg)
    case = plan.cases[0].case
    assert (case.micro_batch, case.clip, case.dtype) == (2, 1.0, "fp32")
    got = _assumed(plan)
    assert {got[k][0] for k in ("train_micro_batch_size_per_gpu", "gradient_clipping", "bf16/fp16.enabled")} \
        == {"mapped"}


def test_silent_clipping_is_left_to_the_version():
    cfg = {k: v for k, v in BASE.items() if k != "gradient_clipping"}
    plan = plan_audit(cfg)
    assert all(c.case.clip is None for c in plan.cases)  # the key stays out: the version's default applies
    assert "gradient_clipping" not in plan.cases[0].case.ds_config(1)
    assert plan.cases[1].case.target_norm == 2.0 and _assumed(plan)["gradient_clipping"][0] == "derived"


def test_fp16_and_nvme_map_to_cpu_runnable_paths():
    cfg = {**BASE, "bf16": {"enabled": False}, "fp16": {"enabled": True},
           "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}}
    plan = plan_audit(cfg)
    case = plan.cases[0].case
    assert (case.zero_stage, case.offload, case.dtype) == (1, "cpu", "bf16")
    assert "nvme_path" not in case.ds_config(1)["zero_optimization"]["offload_optimizer"]


def test_multi_backward_only_when_asked():
    cfg = {**BASE, "gradient_accumulation_steps": 1}
    assert [c.role for c in plan_audit(cfg).cases] == ["accumulation", "clipping"]
    for boundary, want in (("both", ["manual", "none"]), ("manual", ["manual"]), ("none", ["none"])):
        plan = plan_audit(cfg, backward_per_step=4, boundary=boundary)
        multi = [c.case for c in plan.cases if c.role.startswith("multi-backward")]
        assert [(c.backward_calls, c.boundary) for c in multi] == [(4, b) for b in want]


def test_multi_backward_needs_the_loops_boundary_and_nothing_else_takes_one():
    cfg = {**BASE, "gradient_accumulation_steps": 1}
    with pytest.raises(UserError, match="--boundary manual|none|both"):
        plan_audit(cfg, backward_per_step=4)
    with pytest.raises(UserError, match="--backward-per-step K > 1"):
        plan_audit(cfg, boundary="none")


def test_ga_times_several_backward_calls_is_refused_not_guessed():
    """GA 2 x K 2: set_gradient_accumulation_boundary overrides DeepSpeed's counter; the probe does not model where
    the optimizer then steps, so it refuses, naming both values and the GA-1 audit that works."""
    with pytest.raises(UserError) as exc:
        plan_audit({**BASE, "gradient_accumulation_steps": 2}, backward_per_step=2, boundary="manual")
    msg = str(exc.value)
    assert "--backward-per-step 2 with gradient_accumulation_steps 2 is not modelled" in msg
    assert "--gradient-accumulation-steps 1" in msg
    with pytest.raises(UserError, match="not modelled"):  # the override counts, not only the config's value
        plan_audit({**BASE, "gradient_accumulation_steps": 1}, ga_override=2, backward_per_step=2, boundary="none")
    assert plan_audit({**BASE, "gradient_accumulation_steps": 2}, backward_per_step=1).cases[0].case.ga == 2


@pytest.mark.parametrize(("clip", "max_grad_norm", "asked"), [
    (None, None, 0.0), (1.0, None, 1.0), (0.0, None, 0.0), (None, 0.3, 0.3), (1.0, 0.3, 0.3)])
def test_the_threshold_asked_for(clip, max_grad_norm, asked):
    cfg = {k: v for k, v in BASE.items() if k != "gradient_clipping"}
    if clip is not None:
        cfg["gradient_clipping"] = clip
    plan = plan_audit(cfg, max_grad_norm=max_grad_norm)
    assert plan.clip_asked == asked
    label = plan.cases[1].label
    assert ("no gradient_clipping" in label) == (clip is None)
    assert ("sets gradient_clipping 0: no clipping" in label) == (clip == 0.0)


def test_ga_derivation_is_listed_and_uses_the_run_world_size():
    cfg = {k: v for k, v in BASE.items() if k != "gradient_accumulation_steps"}
    cfg["train_batch_size"] = 16
    cfg["train_micro_batch_size_per_gpu"] = 2
    plan = plan_audit(cfg, ranks=2)
    assert plan.cases[0].case.ga == 4
    how, detail = _assumed(plan)["gradient_accumulation_steps"]
    assert how == "derived" and "--world-size" in detail
    assert plan_audit(cfg, ranks=1, world_size=8).cases[0].case.ga == 1  # an 8-GPU run: GA 1, not 8
    only_tbs = plan_audit({"train_batch_size": 8, "zero_optimization": {"stage": 2}})
    assert only_tbs.cases[0].case.ga == 1 and _assumed(only_tbs)["gradient_accumulation_steps"][0] == "derived"


@pytest.mark.parametrize(("patch", "key"), [
    ({"zero_optimization": {"stage": 5}}, "zero_optimization.stage"),
    ({"zero_optimization": {"stage": "two"}}, "zero_optimization.stage"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ({"gradient_clipping": "lots"}, "gradient_clipping"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}}, "offload_optimizer.device"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "both true"),
])
def test_bad_values_name_their_key(patch, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        plan_audit({**BASE, **patch})


def test_load_config_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_config(bad)
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps([1, 2]))
    with pytest.raises(UserError, match="JSON object"):
        load_config(arr)
