"""Each loss term against a hand-computed example."""

import math

import pytest
import torch

from gradfidelity.studies.sft_rl import losses


def test_agg_bug_vs_global_token_mean_hand_batch():
    # micro-batch A: one sequence, 1 token, loss 4; micro-batch B: 3 tokens, losses 1, 1, 1
    a, ma = torch.tensor([[4.0, 9.0]]), torch.tensor([[1.0, 0.0]])
    b, mb = torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[1.0, 1.0, 1.0]])
    assert float(losses.global_token_mean([a, b], [ma, mb])) == pytest.approx((4 + 3) / 4)      # 1.75
    assert float(losses.per_micro_batch_mean([a, b], [ma, mb])) == pytest.approx((4 / 1 + 3 / 3) / 2)  # 2.5
    # equal token counts: the two coincide
    c = torch.tensor([[2.0, 0.0, 0.0]])
    mc = torch.tensor([[1.0, 1.0, 1.0]])
    assert float(losses.global_token_mean([b, c], [mb, mc])) == pytest.approx(
        float(losses.per_micro_batch_mean([b, c], [mb, mc])))


def test_luffy_shaping_values_and_gradient():
    p = torch.tensor([0.1, 0.9], requires_grad=True)
    f = losses.luffy_shaping(p, 0.1)
    assert f.tolist() == pytest.approx([0.5, 0.9])
    f.sum().backward()
    assert p.grad.tolist() == pytest.approx([0.1 / 0.2 ** 2, 0.1 / 1.0 ** 2])  # gamma / (p + gamma)^2


def test_luffy_tokens_off_and_on_policy():
    logps = torch.log(torch.tensor([[0.1, 0.9], [0.5, 0.5]])).requires_grad_()
    adv = torch.tensor([2.0, -1.0])
    off = torch.tensor([True, False])
    per_tok = losses.luffy_tokens(logps, adv, off, 0.1)
    assert per_tok.detach().flatten().tolist() == pytest.approx([-1.0, -1.8, 1.0, 1.0])  # -A f(p) ; -A * ratio(=1)
    per_tok.sum().backward()
    # d/dlogp of -A f(exp(logp)) = -A * gamma p / (p + gamma)^2 ; on-policy: -A
    exp_off = [-2.0 * 0.1 * p / (p + 0.1) ** 2 for p in (0.1, 0.9)]
    assert logps.grad.flatten().tolist() == pytest.approx(exp_off + [1.0, 1.0])


def test_group_advantages_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert losses.group_advantages(r, 3, scale=False).tolist() == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])
    sd = torch.tensor([1.0, 0.0, 0.0]).std().item()
    assert losses.group_advantages(r, 3, scale=True)[0].item() == pytest.approx((2 / 3) / (sd + 1e-4))


def test_srft_weights_and_loss_hand():
    h = torch.tensor(math.log(2.0))
    w_sft, w_pos = losses.srft_weights(h)
    assert float(w_sft) == pytest.approx(0.25) and float(w_pos) == pytest.approx(0.2)
    roll = torch.log(torch.tensor([[0.5, 0.5], [0.25, 1.0]]))
    rmask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    rewards = torch.tensor([1.0, 0.0])
    demo = torch.log(torch.tensor([[0.5, 0.25]]))
    dmask = torch.ones(1, 2)
    loss = losses.srft_loss(roll, rmask, adv, rewards, demo, dmask, h)
    # SFT: 0.25 * mean(-log .5, -log .25) ; RL: tokens (-1*0.2, -1*0.2, +1*1) / 3
    expected = 0.25 * (math.log(2) + math.log(4)) / 2 + (-0.2 - 0.2 + 1.0) / 3
    assert float(loss) == pytest.approx(expected)


def test_relift_buffer_logic():
    buf = losses.HardestBuffer(capacity=2)
    prompts = ["a", "a", "b", "b", "c", "c"]
    demos = ["A", "A", "B", "B", "C", "C"]
    assert buf.add_failed_groups(prompts, demos, [0, 0, 1, 0, 0, 0], group=2) == 2  # a and c failed entirely
    assert buf.items == [("a", "A"), ("c", "C")]
    assert buf.pop_full() == [("a", "A"), ("c", "C")] and buf.items == []
    buf.add_failed_groups(["d", "d"], ["D", "D"], [0, 0], group=2)
    assert buf.pop_full() is None  # not full yet
    restored = losses.HardestBuffer(5)
    restored.load_state_dict(buf.state_dict())
    assert restored.capacity == 2 and restored.items == [("d", "D")]
    with pytest.raises(ValueError):
        losses.HardestBuffer(0)


def test_hpt_gate_and_loss_hand():
    n_correct = torch.tensor([0, 0, 2, 2])
    use_sft = losses.hpt_gate(n_correct, gate=0)
    assert use_sft.tolist() == [True, True, False, False]
    assert losses.hpt_gate(torch.tensor([1]), gate=1).tolist() == [True]
    roll = torch.log(torch.tensor([[0.5], [0.5], [0.5], [0.5]]))
    rmask = torch.ones(4, 1)
    adv = torch.tensor([0.0, 0.0, 1.0, -3.0])
    demo = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.9, 0.9], [0.9, 0.9]]))
    dmask = torch.ones(4, 2)
    demo_row = torch.tensor([True, False, True, False])
    loss = losses.hpt_loss(roll, rmask, adv, use_sft, demo, dmask, demo_row)
    # RL on rows 2, 3: (-1 + 3) / 2 = 1 ; SFT on row 0's demonstration only: -log 0.5
    assert float(loss) == pytest.approx(1.0 + math.log(2))
