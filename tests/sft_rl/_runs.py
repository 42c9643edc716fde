"""Hand-made run records of study A for the aggregate, tables, claims and earlier-record tests: every planned run's
metrics.json as the harness writes it, with accuracies under which every claim A5-A9 holds unless a test says
otherwise."""

import json
import zlib

import numpy as np

from gradfidelity.harness.io import atomic_write_json
from gradfidelity.studies.sft_rl import plan
from gradfidelity.studies.sft_rl.config import StudyConfig
from tests.sft_rl._config import METHODS, make_cfg

SCALE = "cpu"
TASK = {"seed": 1234, "n_train": 64, "n_eval": 32, "n_pretrain": 30}

# `id` accuracy (points) of each run directory (variant, method), and of long and ood unless `sets` says otherwise;
# with these every claim A5-A9 holds and every gate passes (the base model, every arm's start but SFT-then-RL's, is
# at BASE_ACC; the test task's constant answers are 21.9 id, 18.75 long, 25.0 ood)
HOLDS = {
    ("fixed", "sft"): 60.0, ("ds_bug", "sft"): 50.0, ("agg_bug", "sft"): 57.0, ("both", "sft"): 45.0,
    ("fixed", "rl"): 30.0, ("fixed", "sft_then_rl"): 72.0, ("both", "sft_then_rl"): 55.0,
    ("fixed", "luffy"): 64.0, ("fixed", "srft"): 62.0, ("fixed", "relift"): 61.0, ("fixed", "hpt"): 63.0,
    ("fixed", "sft_then_rl_truncated"): 70.0, ("both", "sft_then_rl_truncated"): 50.0,
}
BASE_ACC = 40.0
FLOPS = {"sft": 1e12, "sft_then_rl": 6e12, "sft_then_rl_truncated": 1.5e12}  # RL-stage methods: 5e12
# (demonstration tokens, generated tokens) per run: sft_then_rl at the paper recipe's 1:4 (A9's FLOPs part)
TOKENS = {"sft": (20_000, 0), "rl": (0, 80_000), "sft_then_rl": (20_000, 80_000),
          "sft_then_rl_truncated": (20_000, 8_000)}  # mixed methods: (30_000, 80_000)
REWARD = (0.1, 0.6)  # RL training reward of every RL-stage run, first -> last step (rising)
LR = 3e-4


def _noise(variant: str, method: str, seed: int) -> float:
    """Deterministic per-run scatter (points) so that paired intervals have a width."""
    return (zlib.crc32(f"{variant}/{method}/{seed}".encode()) % 17 - 8) * 0.1 + 0.011 * seed * len(variant + method)


ACC_KEYS = ("acc_id", "acc_long", "acc_ood", "acc_macro", "nll_id", "nll_macro")


def _cfg(seeds, methods=None) -> StudyConfig:
    return make_cfg({"seeds": list(seeds), "methods": methods or METHODS, "bug_stages": ["sft"], "task": TASK})


def _accs(v: float, noise: float = 0.0, long: float | None = None, ood: float | None = None) -> dict:
    a = {"acc_id": v + noise, "acc_long": (v if long is None else long) + noise,
         "acc_ood": (v if ood is None else ood) + noise}
    return {**a, "acc_macro": sum(a.values()) / 3, "nll_id": 1.0 - v / 100, "nll_macro": 1.0}


def _ramp(start: float, end: float, seed: int) -> list[float]:
    """A 10-step history from `start` to about `end`, shifted and steepened per seed (a flat one stays flat)."""
    return [start + 0.01 * seed + (end - start) * (1 + 0.1 * seed) * t for t in np.linspace(0, 1, 10)]


def write_runs(root, cfg, acc=None, diverged=(), flops=None, scale=SCALE, sets=None, alias=None, reward=None,
               tokens=None, start=None, base_acc=None) -> list[str]:
    """Every planned run's metrics.json as the harness writes it, with its plan cell (the rule's wildcards and the
    stage the runner ran), then the base model's; `diverged` = {(variant, method, seed)}; `sets`: {(variant, method)
    or "*": {"long": x, "ood": y}}, the long and ood accuracy instead of the `id` one; `alias`: {(variant, method):
    (variant, method)}, a run whose accuracies (noise included) are another run's; `reward`: {(variant, method):
    (first, last)}; `tokens`: {method: (demo, gen)}; `start`: {seed: (step, drop)}, the SFT runs of that seed record
    an SFT-then-RL start (sft.start_every) at `step` whose accuracies are the run's minus `drop`, and its SFT-then-RL
    runs say they started there; `base_acc`: {base seed: acc_id of that base model} (default BASE_ACC)."""
    start, base_acc = start or {}, base_acc or {}
    acc, flops, tokens = {**HOLDS, **(acc or {})}, {**FLOPS, **(flops or {})}, {**TOKENS, **(tokens or {})}
    sets, alias, reward = sets or {}, alias or {}, reward or {}

    def accs(key, noise_key, seed):
        return _accs(acc[key], _noise(*noise_key, seed), **sets.get(key, sets.get("*", {})))

    paths = plan.planned_runs(cfg, str(root))
    for path in paths:
        variant, method, seed_dir = path.split("/")[-4:-1]
        seed = int(seed_dir.removeprefix("seed"))
        if (variant, method, seed) in diverged:
            rec = {"status": "diverged", "metrics": {"step": 3}}
        else:
            key = alias.get((variant, method), (variant, method))
            demo, gen = tokens.get(method, (30_000, 80_000))
            m = {**accs(key, key, seed), "flops": flops.get(method, 5e12) * (1 + 0.01 * seed),
                 "demo_tokens": demo, "gen_tokens": gen, "loss_history": [2.0, 1.0], "reward_history": None}
            if method != "sft":
                m.update(lr=LR, reward_history=_ramp(*reward.get((variant, method), REWARD), seed),
                         zero_adv_history=_ramp(0.5, 0.7, 0), loss_history=_ramp(1.0, 0.5, 0))
            if method == "sft" and seed in start:
                step, drop = start[seed]
                at = {k: v - drop if k.startswith("acc_") else v for k, v in m.items() if k in ACC_KEYS}
                m["start"] = {**at, "step": step, "flops": m["flops"] * step / 200, "demo_tokens": demo // 2,
                              "gen_tokens": 0, "acc_val": at["acc_id"]}
            if method == "sft_then_rl" and seed in start:
                m["start_step"] = start[seed][0]
            if method == "sft_then_rl":
                t = (variant, "sft_then_rl_truncated")
                demo, gen = tokens["sft_then_rl_truncated"]
                m["truncated"] = {**accs(t, (variant, "trunc"), seed), "demo_tokens": demo, "gen_tokens": gen,
                                  "flops": flops["sft_then_rl_truncated"] * (1 + 0.01 * seed), "rl_steps": 4}
            rec = {"status": "ok", "metrics": m}
        wildcards = {"model": path.split("/")[-5], "variant": variant, "seed": str(seed)}
        cell = {"study": "sft_rl", **wildcards, "stage": "sft"} if method == "sft" else \
            {"study": "sft_rl", **wildcards, "method": method, "stage": "rl"}
        atomic_write_json(path, {**rec, "study": "sft_rl", "scale": scale, "seed": seed, "threads": 1,
                                 "cell": cell, "timing": {}})
    bases = plan.base_runs(cfg, str(root))
    for path in bases:
        model, b = path.split("/")[-4], int(path.split("/")[-2].removeprefix("seed"))
        m = _accs(base_acc.get(b, BASE_ACC), 0.0, **sets.get("*", {}))
        atomic_write_json(path, {"status": "ok", "metrics": m, "study": "sft_rl", "scale": scale, "seed": b,
                                 "threads": 1, "cell": {"study": "sft_rl", "model": model, "seed": str(b),
                                                        "stage": "pretrain"}, "timing": {}})
    return paths + bases


def _two_budgets(tmp_path, early_mixed: float = 80.0):
    """Runs of a 10-step RL stage evaluated at step 5 too (rl.eval_steps [5], truncation 20%: steps 1 and 2): at step
    5 every mixed arm scores `early_mixed` on every set (above SFT-then-RL's 72 by default, so A7 fails there) and
    SFT-then-RL its final score minus 5; the final records are HOLDS' (A7 holds)."""
    cfg = make_cfg({"seeds": [0, 1, 2], "methods": METHODS, "bug_stages": ["sft"], "task": TASK,
                    "rl": {"steps": 10, "eval_steps": [5], "truncated_fraction": 0.2}})
    assert cfg.budgets == [5, 10] and cfg.truncated_at(5) == 1 and cfg.truncated_at(10) == 2
    paths = write_runs(tmp_path / "results" / "sft_rl", cfg)
    for path in paths:
        rec = json.loads(open(path).read())
        m, cell = rec.get("metrics", {}), rec["cell"]
        if cell.get("stage") != "rl" or rec["status"] != "ok":
            continue
        early = _accs(early_mixed if cell["method"] in plan.MIXED else m["acc_id"] - 5.0, 0.1 * int(cell["seed"]))
        at = {"5": {**early, "flops": m["flops"] / 2, "demo_tokens": 1, "gen_tokens": 2, "rl_steps": 5}}
        if cell["method"] == "sft_then_rl":
            at["1"] = {**_accs(33.0), "flops": 1.0, "demo_tokens": 1, "gen_tokens": 1, "rl_steps": 1}
            at["2"] = dict(m["truncated"], rl_steps=2)
            m["truncated"] = at["2"]
        m["at_step"] = at
        atomic_write_json(path, rec)
    return cfg, paths
