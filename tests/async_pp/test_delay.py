"""Delay schedules and mitigations against hand-computed SGD recurrences (independent of the wrapper's code)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.delay import DelaySimulator, DelaySpec

LR = 0.5


class Three(nn.Module):
    """Three scalars, one per pipeline stage; loss = 0.5 * a * (w0 + w1 + w2)^2 couples the stages."""

    def __init__(self, w=(1.0, 0.5, -0.25)):
        super().__init__()
        self.w0, self.w1, self.w2 = (nn.Parameter(torch.tensor(v, dtype=torch.float64)) for v in w)


def loss_fn(params, j):
    s = params["w0"] + params["w1"] + params["w2"]
    return 0.5 * s * s


def run(spec, steps, opt_cls=torch.optim.SGD, **opt_kw):
    m = Three()
    opt = opt_cls(m.parameters(), lr=LR, **opt_kw)
    sim = DelaySimulator(m, opt, spec, {"w0": 0, "w1": 1, "w2": 2} if spec.depth == 3 else None)
    traj = [[p.item() for p in m.parameters()]]
    for t in range(steps):
        sim.step(t, loss_fn)
        traj.append([p.item() for p in m.parameters()])
    return traj


def reference(steps, delay_of_stage, mixed=True):
    """Plain-python recurrence: W[t+1][k] = W[t][k] - LR * g_k, g_k = sum of the weights at the evaluation point."""
    W = [[1.0, 0.5, -0.25]]
    for t in range(steps):
        d = delay_of_stage(t)
        g = []
        for k in range(3):
            if mixed:  # each stage's own stale weights
                s = sum(W[max(t - d[j], 0)][j] for j in range(3))
            else:  # consistent version W(t - d_k)
                s = sum(W[max(t - d[k], 0)])
            g.append(s)
        W.append([W[t][k] - LR * g[k] for k in range(3)])
    return W


def close(a, b):
    return all(abs(x - y) < 1e-12 for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_sync_is_plain_sgd():
    assert close(run(DelaySpec("sync"), 6), reference(6, lambda t: [0, 0, 0]))


def test_2bw_uses_previous_weights_and_differs_from_sync():
    got = run(DelaySpec("2bw"), 6)
    assert close(got, reference(6, lambda t: [1, 1, 1]))
    assert not close(got, reference(6, lambda t: [0, 0, 0]))
    # by hand: s0 = 1.25; w(1) = w(0) - 0.5*1.25; w(2) = w(1) - 0.5*1.25 (gradient still at w(0))
    assert got[2][0] == pytest.approx(1.0 - 2 * 0.5 * 1.25)


def test_pipedream_without_vertical_sync_is_per_stage_stale_mixed_point():
    got = run(DelaySpec("pipedream", depth=3), 7)
    assert close(got, reference(7, lambda t: [2, 1, 0], mixed=True))
    assert not close(got, reference(7, lambda t: [2, 1, 0], mixed=False))


def test_pipedream_vertical_sync_is_consistent_version_per_stage():
    got = run(DelaySpec("pipedream_vsync", depth=3), 7)
    assert close(got, reference(7, lambda t: [2, 1, 0], mixed=False))


def test_sync_start_and_cooldown_windows():
    got = run(DelaySpec("2bw", "sync_start", sync_start_steps=3), 7)
    assert close(got, reference(7, lambda t: [0, 0, 0] if t < 3 else [1, 1, 1]))
    got = run(DelaySpec("2bw", "sync_cooldown", total_steps=7, sync_cooldown_steps=2), 7)
    assert close(got, reference(7, lambda t: [0, 0, 0] if t >= 5 else [1, 1, 1]))


def test_error_feedback_formula():
    """x(t+1) = x(t) - 2 u_t + u_{t-1}, u_t = LR * g(x(t-1)), u_{-1} = 0."""
    got = run(DelaySpec("2bw", "error_feedback"), 6)
    W, u_prev = [[1.0, 0.5, -0.25]], [0.0, 0.0, 0.0]
    for t in range(6):
        s = sum(W[max(t - 1, 0)])
        u = [LR * s] * 3
        W.append([W[t][k] - 2 * u[k] + u_prev[k] for k in range(3)])
        u_prev = u
    assert close(got, W)


def test_taylor_fixed_lambda_formula():
    lam = 0.3
    got = run(DelaySpec("2bw", "taylor", taylor_lambda=lam, taylor_adaptive=False), 5)
    W = [[1.0, 0.5, -0.25]]
    for t in range(5):
        stale = W[max(t - 1, 0)]
        g = sum(stale)
        W.append([W[t][k] - LR * (g + lam * g * g * (W[t][k] - stale[k])) for k in range(3)])
    assert close(got, W)


def test_taylor_adaptive_lambda_formula():
    lam0, ema = 2.0, 0.9
    got = run(DelaySpec("2bw", "taylor", taylor_lambda=lam0, taylor_adaptive=True, taylor_ema=ema), 5)
    W, ms = [[1.0, 0.5, -0.25]], None
    for t in range(5):
        stale = W[max(t - 1, 0)]
        g = sum(stale)
        ms = g * g if ms is None else ema * ms + (1 - ema) * g * g
        lam = lam0 / (ms ** 0.5 + 1e-12)
        W.append([W[t][k] - LR * (g + lam * g * g * (W[t][k] - stale[k])) for k in range(3)])
    assert close(got, W)


class GradClobberingSGD(torch.optim.SGD):
    """Like several real optimizers: modifies p.grad in place after use and remembers the tensor."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen = []

    @torch.no_grad()
    def step(self, closure=None):
        out = super().step(closure)
        for g in self.param_groups:
            for p in g["params"]:
                self.seen.append(p.grad)
                p.grad.mul_(1e6)  # would corrupt a reused / stored delayed gradient
        return out


def test_each_step_gets_a_fresh_gradient_tensor():
    m = Three()
    opt = GradClobberingSGD(m.parameters(), lr=LR)
    sim = DelaySimulator(m, opt, DelaySpec("2bw"))
    traj = [[p.item() for p in m.parameters()]]
    for t in range(5):
        sim.step(t, loss_fn)
        traj.append([p.item() for p in m.parameters()])
    assert close(traj, reference(5, lambda t: [1, 1, 1]))
    # never the same storage twice: not across steps, not across parameters of one step (autograd hands the
    # same tensor to w0, w1, w2 here, because d(w0 + w1 + w2) passes the incoming gradient through unchanged)
    assert len(opt.seen) == 15
    assert len({g.data_ptr() for g in opt.seen[-3:]}) == 3
    assert len({id(g) for g in opt.seen}) == 15


def test_checkpoint_resume_of_the_history():
    spec = DelaySpec("pipedream", "error_feedback", depth=3)
    full = run(spec, 8, torch.optim.SGD, momentum=0.9)
    m = Three()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9)
    stages = {"w0": 0, "w1": 1, "w2": 2}
    sim = DelaySimulator(m, opt, spec, stages)
    for t in range(4):
        sim.step(t, loss_fn)
    state = {"m": {k: v.clone() for k, v in m.state_dict().items()}, "sim": sim.state_dict()}
    m2 = Three()
    m2.load_state_dict(state["m"])
    sim2 = DelaySimulator(m2, torch.optim.SGD(m2.parameters(), lr=LR, momentum=0.9), spec, stages)
    sim2.load_state_dict(state["sim"])
    for t in range(4, 8):
        sim2.step(t, loss_fn)
    assert close([[p.item() for p in m2.parameters()]], [full[-1]])


def test_bad_names_are_user_errors():
    with pytest.raises(UserError, match="schedule"):
        DelaySpec("3bw")
    with pytest.raises(UserError, match="mitigation"):
        DelaySpec("2bw", "magic")
    with pytest.raises(UserError, match="delayed schedule"):
        DelaySpec("sync", "error_feedback")


# ----------------------------------------------------------------------------------------------- tied weights
def _decoder(tie: bool):
    from gradfidelity.studies.async_pp.model import build_model
    from tests.async_pp._cfg import model_config

    cfg = model_config(vocab_size=20, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=8,
                       tie_embeddings=tie)
    return build_model(cfg, seed=0, dtype=torch.float64)


def test_pipedream_last_stage_is_fresh_with_an_untied_head():
    """Spy on where the gradient is evaluated: at step t >= P-1 the LM head and final norm (last stage) are the live
    parameters, the embedding (stage 0) is the copy of P-1 updates ago."""
    from gradfidelity.studies.async_pp.delay import model_loss_fn
    from gradfidelity.studies.async_pp.model import lm_loss, stage_of_params

    P = 4
    m = _decoder(tie=False)
    stages = stage_of_params(m, P)
    assert stages["lm_head.weight"] == P - 1 and stages["norm.weight"] == P - 1 and stages["embed_tokens.weight"] == 0
    sim = DelaySimulator(m, torch.optim.SGD(m.parameters(), lr=0.1), DelaySpec("pipedream", depth=P), stages)
    x, y = torch.randint(0, 20, (2, 8)), torch.randint(0, 20, (2, 8))
    inner = model_loss_fn(m, [(x, y)], lm_loss)
    seen, embed_history = [], []
    live = dict(m.named_parameters())

    def spy(params, j):  # the values at evaluation time (the live ones move in the update after)
        seen.append({"head_is_live": params["lm_head.weight"] is live["lm_head.weight"],
                     "norm_is_live": params["norm.weight"] is live["norm.weight"],
                     "embed": params["embed_tokens.weight"].detach().clone()})
        return inner(params, j)

    for t in range(6):
        embed_history.append(m.embed_tokens.weight.detach().clone())
        sim.step(t, spy)
        pt = seen[-1]
        assert pt["head_is_live"] and pt["norm_is_live"]
        stale = embed_history[max(t - (P - 1), 0)]
        assert torch.equal(pt["embed"], stale)
        if t >= P - 1:
            assert not torch.equal(stale, m.embed_tokens.weight.detach())  # really stale: it has moved since


def test_pipedream_refuses_a_tied_head():
    from gradfidelity.studies.async_pp.model import stage_of_params

    m = _decoder(tie=True)
    with pytest.raises(UserError, match="untied"):
        DelaySimulator(m, torch.optim.SGD(m.parameters(), lr=0.1), DelaySpec("pipedream", depth=2),
                       stage_of_params(m, 2))
    DelaySimulator(m, torch.optim.SGD(m.parameters(), lr=0.1), DelaySpec("2bw"))  # 2bw: one delay, tying is fine
