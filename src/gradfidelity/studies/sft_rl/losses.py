"""The loss terms of every method, as pure tensor functions (tested against hand-computed examples).

The trainers (trainers.py) only gather tensors and call these; keeping the formulas here, free of TRL and
DeepSpeed, is what lets a unit test check each one with a batch small enough to compute by hand.

Shapes: B rows (sequences), T tokens; `mask` (B, T) is 1 on tokens that count; `logps` (B, T) are the policy's
per-token log-probabilities (with gradient); `adv` (B,) per-row advantages.

On-policy rows use GRPO with one policy update per generation (num_iterations = 1), so the PPO ratio
pi/pi_old = exp(logp - logp.detach()) is exactly 1 in value and the clipped and unclipped objectives coincide;
its gradient is the REINFORCE gradient adv * grad(logp).
"""

from __future__ import annotations

import torch


# ----------------------------------------------------------------------------- aggregation (docs/sources.md, Study A)
def global_token_mean(per_token: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """The fixed objective: sum of every counted token's loss over the whole accumulation window / their number."""
    total = sum((l * m).sum() for l, m in zip(per_token, masks, strict=True))
    count = sum(m.sum() for m in masks)
    return total / count.clamp(min=1)


def per_micro_batch_mean(per_token: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """The bug (OpenRLHF before its fix): a token mean inside each micro-batch, then the mean over the GA
    micro-batches (DeepSpeed's 1/GA scaling). Tokens of short micro-batches weigh more."""
    means = [(l * m).sum() / m.sum().clamp(min=1) for l, m in zip(per_token, masks, strict=True)]
    return sum(means) / len(means)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def policy_gradient_tokens(logps: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """GRPO per-token loss with ratio exp(logp - sg(logp)) = 1: value -adv, gradient -adv * grad(logp). (B, T)"""
    return -adv[:, None] * torch.exp(logps - logps.detach())


def nll_tokens(logps: torch.Tensor) -> torch.Tensor:
    """SFT per-token loss on a demonstration. (B, T)"""
    return -logps


# ----------------------------------------------------------------------------- LUFFY
def luffy_shaping(p: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """LUFFY's policy shaping f(p) = p / (p + gamma): it replaces the importance ratio on off-policy tokens, so
    low-probability expert tokens still receive a large gradient (df/dp = gamma / (p + gamma)^2)."""
    return p / (p + gamma)


def luffy_tokens(logps: torch.Tensor, adv: torch.Tensor, off_policy: torch.Tensor, gamma: float) -> torch.Tensor:
    """Mixed-policy GRPO: on-policy rows -> policy-gradient term; off-policy (demonstration) rows ->
    -adv * f(pi(token)), unclipped. (B, T); `off_policy` (B,) bool."""
    on = policy_gradient_tokens(logps, adv)
    off = -adv[:, None] * luffy_shaping(torch.exp(logps), gamma)
    return torch.where(off_policy[:, None], off, on)


def group_advantages(rewards: torch.Tensor, group: int, scale: bool) -> torch.Tensor:
    """r - mean over the group (rows are grouped consecutively, `group` per prompt); divided by the group std
    (+1e-4, as TRL) when `scale`. LUFFY uses scale=False. (B,)"""
    r = rewards.view(-1, group)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale:
        adv = adv / (r.std(dim=1, keepdim=True) + 1e-4)
    return adv.reshape(-1)


# ----------------------------------------------------------------------------- SRFT
def srft_weights(entropy: torch.Tensor, sft_coef: float = 0.5, pos_coef: float = 0.1) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    """SRFT's entropy-aware weights from the policy's mean token entropy H (no gradient through H):
    demonstrations w_sft = sft_coef * exp(-H) (trust demonstrations less while the policy is uncertain);
    correct rollouts w_pos = pos_coef * exp(+H)."""
    h = entropy.detach()
    return sft_coef * torch.exp(-h), pos_coef * torch.exp(h)


def srft_loss(roll_logps, roll_mask, adv, rewards, demo_logps, demo_mask, entropy,
              sft_coef: float = 0.5, pos_coef: float = 0.1) -> torch.Tensor:
    """w_sft * NLL(demonstrations) + RL on rollouts, where correct rollouts (reward > 0) carry w_pos and the
    others weight 1. Each term is a token mean over its own tokens."""
    w_sft, w_pos = srft_weights(entropy, sft_coef, pos_coef)
    row_w = torch.where(rewards > 0, w_pos, torch.ones_like(rewards))
    rl = masked_mean(policy_gradient_tokens(roll_logps, adv) * row_w[:, None], roll_mask)
    return w_sft * masked_mean(nll_tokens(demo_logps), demo_mask) + rl


# ----------------------------------------------------------------------------- ReLIFT
class HardestBuffer:
    """ReLIFT's buffer: prompts on which every rollout failed, with their demonstrations. When it holds
    `capacity` items, `pop_full` returns them all (for one SFT step) and empties itself."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"ReLIFT buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.items: list[tuple[str, str]] = []

    def add_failed_groups(self, prompts: list[str], demos: list[str], rewards: list[float], group: int) -> int:
        """Rows are grouped `group` per prompt; add each group whose rewards are all zero. Returns how many."""
        added = 0
        for g in range(0, len(prompts), group):
            if all(r <= 0 for r in rewards[g:g + group]):
                self.items.append((prompts[g], demos[g]))
                added += 1
        return added

    def pop_full(self) -> list[tuple[str, str]] | None:
        if len(self.items) < self.capacity:
            return None
        batch, self.items = self.items[:self.capacity], self.items[self.capacity:]
        return batch

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "items": [list(x) for x in self.items]}

    def load_state_dict(self, state: dict) -> None:
        self.capacity, self.items = state["capacity"], [tuple(x) for x in state["items"]]


# ----------------------------------------------------------------------------- HPT
def hpt_gate(n_correct: torch.Tensor, gate: int = 0) -> torch.Tensor:
    """HPT's switch per prompt: True -> SFT on the demonstration (the group solved it at most `gate` times),
    False -> GRPO on the rollouts."""
    return n_correct <= gate


def hpt_loss(roll_logps, roll_mask, adv, use_sft_row, demo_logps, demo_mask, demo_row) -> torch.Tensor:
    """RL token mean over rows whose prompt passed the gate + NLL token mean over the demonstrations of gated
    prompts (one demonstration per prompt: `demo_row` marks one row per group). Rows of gated prompts carry no
    RL term, rows of other prompts no SFT term."""
    rl_mask = roll_mask * (~use_sft_row)[:, None]
    sft_mask = demo_mask * (use_sft_row & demo_row)[:, None]
    loss = 0.0 * (roll_logps * roll_mask).sum()  # keeps the graph when both masks are empty
    if rl_mask.sum() > 0:
        loss = loss + masked_mean(policy_gradient_tokens(roll_logps, adv), rl_mask)
    if sft_mask.sum() > 0:
        loss = loss + masked_mean(nll_tokens(demo_logps), sft_mask)
    return loss
