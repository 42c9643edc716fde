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


def test_keeps_the_gradient_path():
    plan = plan_audit(BASE)
    (case,) = plan.cases
    assert (case.zero_stage, case.offload, case.ga, case.dtype, case.micro_batch, case.clip) == (2, "cpu", 4, "bf16",
                                                                                               1, 1.0)
    ds = case.ds_config(world=1)
    assert ds["zero_optimization"]["offload_optimizer"] == {"pin_memory": True, "device": "cpu"}
    assert ds["zero_optimization"]["overlap_comm"] is True
    assert "reduce_bucket_size" not in ds["zero_optimization"]  # "auto" dropped
    assert "optimizer" not in ds  # the probe's own SGD(lr=1) is the client optimizer
    assert ds["train_batch_size"] == 1 * 4 * 1


def test_auto_ga_needs_the_flag():
    cfg = {**BASE, "gradient_accumulation_steps": "auto"}
    with pytest.raises(UserError, match="--gradient-accumulation-steps"):
        plan_audit(cfg)
    assert plan_audit(cfg, ga_override=8).cases[0].ga == 8


def test_auto_values_become_notes():
    cfg = {**BASE, "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
           "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    plan = plan_audit(cfg)
    case = plan.cases[0]
    assert (case.micro_batch, case.clip, case.dtype) == (2, 1.0, "fp32")
    assert len(plan.notes) == 3


def test_fp16_and_nvme_map_to_cpu_runnable_paths():
    cfg = {**BASE, "bf16": {"enabled": False}, "fp16": {"enabled": True},
           "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}}
    plan = plan_audit(cfg)
    case = plan.cases[0]
    assert (case.zero_stage, case.offload, case.dtype) == (1, "cpu", "bf16")
    assert "nvme_path" not in case.ds_config(1)["zero_optimization"]["offload_optimizer"]


def test_ga1_also_probes_multi_backward():
    plan = plan_audit({**BASE, "gradient_accumulation_steps": 1})
    assert [c.backward_calls for c in plan.cases] == [1, 4]
    assert [c.backward_calls for c in plan_audit({**BASE, "gradient_accumulation_steps": 1},
                                                 backward_calls=1).cases] == [1]


def test_ga_derived_from_batch_sizes():
    cfg = {k: v for k, v in BASE.items() if k != "gradient_accumulation_steps"}
    cfg["train_batch_size"] = 16
    cfg["train_micro_batch_size_per_gpu"] = 2
    assert plan_audit(cfg, ranks=2).cases[0].ga == 4


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
