"""One registry for the six optimizers of study B, with `momentum` as the one name for the momentum decay.

Implementations: AdamW from torch.optim; Muon, SOAP, Adan, Lion, MARS from pytorch-optimizer (>= 4.1.0: 3.9.0
inverted Muon's LR scaling). Muon updates the hidden weight matrices only; the embedding, the LM head and the norm
gains go to its built-in AdamW groups (`use_muon=False`), as in Keller Jordan's reference. `muon_all` (issue 60) is
the same Muon with the embedding and the LM head in its Muon group too (only the norm gains stay with AdamW): at the
cpu scale's d 32 those two matrices are 47% of the parameters, so the `muon` arm's delay cost is partly AdamW's;
`muon_all` separates that share. It is a probe, not a recipe: orthogonalising an embedding's update spreads it over
rows whose tokens were not in the batch, which is why the reference keeps embeddings on AdamW.

Defaults (chosen before any result was seen; the paper's appendix values are unknown). The default LR and momentum
live in `config.DEFAULTS` only; the LR actually used is chosen per optimizer on the sync schedule from a grid of
multiples of that default (lr_select.py, config `lr_selection`).
| optimizer | lr | momentum maps to | other | source |
|---|---|---|---|---|
| adamw | 2e-3 | betas[0] 0.9 | beta2 (1 + beta1) / 2 = 0.95, wd 0.1, eps 1e-8 | nanoGPT/SmolLM betas, wd |
| muon | 2e-3 | momentum 0.95 | nesterov, 5 NS, `use_adjusted_lr`; aux AdamW same lr, wd 0.1 | Moonlight |
| soap | 3e-3 | betas[0] 0.95 | beta2 0.95, wd 0.01, precondition every 10 | SOAP reference defaults |
| adan | 2e-3 | betas[0] 0.98 | betas (0.98, 0.92, 0.99), decoupled wd 0.02 | Adan paper betas |
| lion | 4e-4 | betas[1] 0.99 | beta1 0.9, decoupled wd 0.5 | Lion paper: lr 3-10x lower, wd higher |
| mars | 3e-3 | betas[0] 0.95 | beta2 0.99, gamma 0.025, wd 0.1; 1-D params AdamW without decay | MARS defaults |
| muon_all | 2e-3 | momentum 0.95 | as muon; embedding and head in the Muon group (wd 0.1 there, AdamW's) | issue 60 |

Muon's LR and width: with Keller Jordan's shape factor an orthogonalised update has per-entry RMS lr / sqrt(max dim),
so the same LR is a ~5x larger step at d = 32 than at d = 960. We use pytorch-optimizer's `use_adjusted_lr=True`
(Moonlight's factor 0.2 sqrt(max dim)): the per-entry RMS is 0.2 lr at every width, AdamW's scale, and Muon's
embedding/head/gain groups (AdamW) take the same LR (docs/sources.md, Study B).
MARS: `weight_decay_1d` is 0 (pytorch-optimizer's default 0.1 would decay the norm gains, which no other optimizer
here does).

Lion's `momentum` is beta2, the decay of its momentum buffer (beta1 only interpolates the sign argument); for the
others it is the decay of the first-moment / momentum buffer.

AdamW's beta2 moves with its momentum (`adam_beta2`): 1 - beta2 = (1 - beta1) / 2, so the second moment always
averages over twice the first moment's horizon (0.95 at the default 0.9, nanoGPT's value). Round 2's sweep held
beta2 at 0.95 and so put beta1 = 0.98 above sqrt(beta2) = 0.975, where Adam's updates are known to be unstable
(beta1 < sqrt(beta2) is the condition of Zhang et al. 2022, "Adam can converge without any modification"): its
largest momentum measured that instability, not the delay. With the coupling, beta1 < sqrt(beta2) holds at every
beta1 in [0, 1) (2 b^2 - b - 1 < 0 there). SOAP and MARS keep a fixed beta2: `config.check_betas` refuses a momentum
that would break the condition for them, as the config loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import DEFAULTS, FIXED_BETA2, adam_beta2, check_betas


@dataclass(frozen=True)
class OptSpec:
    lr: float
    momentum: float
    weight_decay: float
    extra: dict = field(default_factory=dict)
    source: str = ""


def _spec(name: str, weight_decay: float, extra: dict, source: str) -> OptSpec:
    return OptSpec(DEFAULTS[name]["lr"], DEFAULTS[name]["momentum"], weight_decay, extra, source)


REGISTRY: dict[str, OptSpec] = {
    "adamw": _spec("adamw", 0.1, {"eps": 1e-8}, "torch.optim.AdamW; nanoGPT/SmolLM betas"),
    "muon": _spec("muon", 0.0, {"adamw_wd": 0.1, "nesterov": True, "ns_steps": 5},
                  "pytorch_optimizer.Muon(use_adjusted_lr=True); Moonlight RMS matching"),
    "soap": _spec("soap", 0.01, {"beta2": FIXED_BETA2["soap"], "precondition_frequency": 10},
                  "pytorch_optimizer.SOAP; SOAP reference defaults"),
    "adan": _spec("adan", 0.02, {"beta2": 0.92, "beta3": 0.99}, "pytorch_optimizer.Adan; Adan paper betas"),
    "lion": _spec("lion", 0.5, {"beta1": 0.9}, "pytorch_optimizer.Lion; Lion paper lr/wd rules"),
    "mars": _spec("mars", 0.1, {"beta2": FIXED_BETA2["mars"], "gamma": 0.025},
                  "pytorch_optimizer.MARS; MARS defaults"),
    "muon_all": _spec("muon_all", 0.0, {"adamw_wd": 0.1, "nesterov": True, "ns_steps": 5},
                      "pytorch_optimizer.Muon(use_adjusted_lr=True), embedding and head in the Muon group"),
}


def _is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    return p.ndim >= 2 and name.startswith("layers.")


def _pytorch_optimizer(name: str, spec: OptSpec, named_params, mats, vecs, lr: float,
                       mom: float) -> torch.optim.Optimizer:
    """Muon, SOAP, Adan, Lion or MARS from pytorch-optimizer, imported here and not at the top: it imports
    transformers, deepspeed's integration and sympy (about 1.6 s a process, issue 37's profile), which an AdamW job
    never uses."""
    import pytorch_optimizer as po

    x = spec.extra
    if name in ("muon", "muon_all"):
        hidden = [p for n, p in named_params if _is_hidden_matrix(n, p)]
        other_m = [p for n, p in named_params if p.ndim >= 2 and not _is_hidden_matrix(n, p)]
        # muon_all: the embedding and head join the Muon group with the decay they had under AdamW
        groups = [{"params": hidden, "use_muon": True, "lr": lr, "weight_decay": spec.weight_decay},
                  {"params": other_m, "use_muon": name == "muon_all", "lr": lr, "weight_decay": x["adamw_wd"]},
                  {"params": vecs, "use_muon": False, "lr": lr, "weight_decay": 0.0}]
        return po.Muon([g for g in groups if g["params"]], lr=lr, momentum=mom, nesterov=x["nesterov"],
                       ns_steps=x["ns_steps"], use_adjusted_lr=True, adamw_lr=lr, adamw_betas=(0.9, 0.95),
                       foreach=False)
    groups = [{"params": mats, "weight_decay": spec.weight_decay}, {"params": vecs, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if name == "soap":
        return po.SOAP(groups, lr=lr, betas=(mom, x["beta2"]), precondition_frequency=x["precondition_frequency"])
    if name == "adan":
        return po.Adan(groups, lr=lr, betas=(mom, x["beta2"], x["beta3"]), weight_decouple=True, foreach=False)
    if name == "lion":
        return po.Lion(groups, lr=lr, betas=(x["beta1"], mom), foreach=False)
    return po.MARS(groups, lr=lr, lr_1d=lr, betas=(mom, x["beta2"]), gamma=x["gamma"], weight_decay_1d=0.0,
                   foreach=False)


def build_optimizer(name: str, named_params: list[tuple[str, nn.Parameter]], *, lr: float | None = None,
                    momentum: float | None = None) -> torch.optim.Optimizer:
    """Build optimizer `name` over `named_params` (a whole model or one pipeline stage: grouping is by parameter
    name, so a stage's optimizer treats each parameter exactly as the whole-model optimizer does).

    Matrices get weight decay, 1-D gains do not. Every group records `base_lr` for the LR schedule.
    """
    if name not in REGISTRY:
        raise UserError(f"async_pp optimizer {name!r} not in {sorted(REGISTRY)}")
    spec = REGISTRY[name]
    lr = spec.lr if lr is None else float(lr)
    mom = spec.momentum if momentum is None else float(momentum)
    if not 0.0 <= mom < 1.0:
        raise UserError(f"async_pp momentum {mom} must be in [0, 1)")
    check_betas(name, mom)
    mats = [p for n, p in named_params if p.ndim >= 2]
    vecs = [p for n, p in named_params if p.ndim < 2]
    if name == "adamw":
        groups = [{"params": mats, "weight_decay": spec.weight_decay}, {"params": vecs, "weight_decay": 0.0}]
        opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(mom, adam_beta2(mom)),
                                eps=spec.extra["eps"])
    else:
        opt = _pytorch_optimizer(name, spec, named_params, mats, vecs, lr, mom)
    for g in opt.param_groups:
        g["base_lr"] = g["lr"]
    return opt


def set_lr_factor(opt: torch.optim.Optimizer, factor: float) -> None:
    for g in opt.param_groups:
        g["lr"] = g["base_lr"] * factor


def lr_factor(step: int, total: int, warmup: int, decay: int, final: float = 0.1) -> float:
    """Warmup-stable-decay: linear warmup over `warmup` steps, constant, linear decay to `final` over the last
    `decay` steps (the 'cooldown' that the sync_cooldown mitigation runs without delay). The factor applied at
    step t is the one after t+1 steps (step 0 already trains at 1/warmup).

    Not `transformers.get_wsd_schedule`: its warmup also rises from `min_lr_ratio` (here 0.1, not 0), and the
    sync_cooldown mitigation needs the decay boundary as a step count anyway. Its stable and decay phases are the
    same function, which tests/async_pp/test_data_optim.py checks against it."""
    if step < warmup:
        return (step + 1) / warmup
    if decay > 0 and step >= total - decay:
        frac = (step - (total - decay) + 1) / decay
        return 1.0 - (1.0 - final) * frac
    return 1.0
