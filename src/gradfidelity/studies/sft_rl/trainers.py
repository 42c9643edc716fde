"""TRL trainer subclasses: token accounting, the aggregation bug, and the four mixed-policy methods.

Everything goes through TRL's SFTTrainer / GRPOTrainer (and therefore through the Trainer's DeepSpeed engine):
the subclasses only (a) count the tokens each forward/backward and each generation processed, for FLOPs,
(b) switch the SFT loss to a per-micro-batch mean for the `agg_bug` variant, and (c) for LUFFY, SRFT, ReLIFT and
HPT, attach the expert demonstration to each prompt and replace GRPO's loss with the method's (losses.py).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer, SFTTrainer

from gradfidelity.studies.sft_rl import losses
from gradfidelity.studies.sft_rl.task import is_correct


def step_outside_grad_mode(accelerator) -> None:
    """With several ranks over gloo, DeepSpeed 0.18.9's ZeRO-1/2 optimizer step all-gathers the updated partitions
    into views made by `split`, which torch 2.13's autograd refuses in grad mode ("Output 0 of Split is a view and
    is being modified inplace"). Accelerate calls `engine.step()` inside `accelerator.backward`, after the engine's
    backward; the step is never differentiated, so it runs under no_grad here (the fault-matrix probe does the same,
    ds_audit/ds_step.py). The engine exists only once training starts, so its step is wrapped at the first backward.
    One process: left untouched."""
    if accelerator.num_processes <= 1:
        return
    backward = accelerator.backward

    def backward_with_guarded_step(loss, **kwargs):
        wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
        engine = getattr(wrapped, "engine", None)
        if engine is not None and not getattr(engine, "_gf_step_no_grad", False):
            step = engine.step

            def step_no_grad(*args, **kw):
                with torch.no_grad():
                    return step(*args, **kw)

            engine.step, engine._gf_step_no_grad = step_no_grad, True
        return backward(loss, **kwargs)

    accelerator.backward = backward_with_guarded_step


class TokenCounter:
    """Tokens processed per kind, for FLOPs: train (forward + backward) and gen (generation, prefill included); demo
    counts the trained tokens that are expert demonstrations (prompt + demonstration: every SFT sequence, a mixed
    method's demonstration forwards), a part of train: how much expert data an arm saw (compute matching)."""

    def __init__(self):
        self.train = 0
        self.gen = 0
        self.demo = 0

    def state_dict(self) -> dict:
        return {"train": self.train, "gen": self.gen, "demo": self.demo}

    def load_state_dict(self, s: dict) -> None:
        self.train, self.gen, self.demo = int(s["train"]), int(s["gen"]), int(s["demo"])


class GFSFTTrainer(SFTTrainer):
    """SFTTrainer that counts tokens and, with `per_micro_mean=True`, aggregates the loss like OpenRLHF before
    its fix: a token mean per micro-batch, divided by GA. The fixed path is TRL's own global token mean
    (num_items_in_batch = tokens of the whole accumulation window)."""

    def __init__(self, *args, per_micro_mean: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        step_outside_grad_mode(self.accelerator)
        self.per_micro_mean = per_micro_mean
        self.tokens = TokenCounter()
        self.recorded_inputs: list[dict] | None = None  # the gradient probe sets a list: micro-batches in order
        if per_micro_mean:
            self.loss_is_scaled_for_ga = True  # we divide by GA ourselves below; the Trainer must not again

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            n = int(inputs["attention_mask"].sum())
            self.tokens.train += n
            self.tokens.demo += n  # every SFT sequence is a demonstration
            if self.recorded_inputs is not None:
                self.recorded_inputs.append({k: v.detach().clone() for k, v in inputs.items()
                                             if isinstance(v, torch.Tensor)})
        if not self.per_micro_mean:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch=None)  # micro token mean
        ga = self.current_gradient_accumulation_steps
        if return_outputs:
            return out[0] / ga, out[1]
        return out / ga

    def gf_state(self) -> dict:
        return {"tokens": self.tokens.state_dict()}

    def gf_load_state(self, s: dict) -> None:
        self.tokens.load_state_dict(s["tokens"])


def length_groups(lengths: torch.Tensor, groups: int) -> list[torch.Tensor]:
    """Row indices in `groups` near-equal micro-batches of similar length (rows sorted by length, stable, so equal
    lengths keep their order), shortest first; fewer groups when there are fewer rows."""
    order = torch.sort(lengths, stable=True).indices
    return [g for g in torch.tensor_split(order, min(groups, len(order))) if len(g)]


def _contiguous(mask: torch.Tensor, lengths: torch.Tensor, left: bool) -> bool:
    """Whether every row of `mask` is one block of ones of its length, at the right end (left padding) or the left
    end (right padding): the only layouts the trim below may cut."""
    width = mask.size(1)
    cols = torch.arange(width).unsqueeze(0)
    want = cols >= width - lengths.unsqueeze(1) if left else cols < lengths.unsqueeze(1)
    return bool(torch.equal(mask.bool(), want))


class GFGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that counts generated and trained tokens (FLOPs accounting) and, with `length_groups` k >= 1,
    runs its log-prob forwards without the padding.

    Why the trim: TRL scores a batch as one tensor, every prompt left-padded to the longest prompt and every
    completion right-padded to the longest completion, so the backbone's forward and backward run on every pad
    position (at the cpu sizes 42 positions a row, 21-29 of them real). With k groups, the rows are sorted by
    length, split into k micro-batches, and each is cut to its own longest prompt and completion; the results are
    padded back to the batch's shape (zeros where the row has no token, which every loss masks out) and put back in
    row order. What does not change: the loss and its normalisation (TRL's, over the whole batch: one backward per
    step), and each real token's position id, which stays the one it has in the padded batch (TRL's forward passes
    none, so the model numbers positions from the first padded column; RoPE depends on relative positions only, so
    renumbering would move only rounding, but keeping them keeps the computation the padded one). What can change:
    the last bits (about 1e-7 in a log-prob), since the rows are reordered and kernels reduce over shapes of another
    size; tests/sft_rl/test_trim.py checks log-probs, loss and gradient against TRL's padded forward."""

    def __init__(self, *args, length_groups: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        step_outside_grad_mode(self.accelerator)
        self.tokens = TokenCounter()
        self.length_groups = length_groups

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        if self.length_groups < 1 or compute_aux_loss or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
        return self._trimmed_logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy)

    def _trimmed_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        n_rows, width = input_ids.shape              # (B, P + C)
        c_width = logits_to_keep                      # C: the completion columns
        p_width = width - c_width                     # P: the prompt columns (left-padded)
        p_len = attention_mask[:, :p_width].sum(1)    # (B,) real prompt tokens
        c_len = attention_mask[:, p_width:].sum(1)    # (B,) real completion tokens
        if not (_contiguous(attention_mask[:, :p_width], p_len, left=True)
                and _contiguous(attention_mask[:, p_width:], c_len, left=False)):
            raise ValueError("length_groups: the batch is not left-padded prompts + right-padded completions; "
                             "set sft_rl.rl.length_groups to 0 (TRL's padded path)")
        logps, ents, rows = [], [], []
        for idx in length_groups(p_len + c_len, self.length_groups):
            p, c = int(p_len[idx].max()), max(1, int(c_len[idx].max()))
            cols = slice(p_width - p, p_width + c)
            ids, mask = input_ids[idx, cols], attention_mask[idx, cols]
            # the position ids these tokens have in the padded batch (positions count from its first column)
            pos = torch.arange(p_width - p, p_width + c, device=ids.device).unsqueeze(0).expand(len(idx), -1)
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-c] = -100                     # only the completion is scored (as TRL)
            with self.accelerator.autocast():
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels, fused_lm_head=True)
            pad = (0, c_width - c)                    # back to the batch's completion width
            logps.append(torch.nn.functional.pad(out.log_probs[:, -c:], pad))
            if compute_entropy:
                ents.append(torch.nn.functional.pad(out.entropy[:, -c:], pad))
            rows.append(idx)
        back = torch.argsort(torch.cat(rows))        # sorted position -> original row
        logps_all = torch.cat(logps)[back]
        ents_all = torch.cat(ents)[back] if compute_entropy else None
        assert logps_all.shape == (n_rows, c_width)
        return logps_all, ents_all, None

    def _count_generation(self, out: dict, rows: torch.Tensor | None = None) -> None:
        keep = slice(None) if rows is None else rows
        self.tokens.gen += int(out["prompt_mask"][keep].sum() + out["completion_mask"][keep].sum())

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self._count_generation(out)
        return out

    def _compute_loss(self, model, inputs):
        self.tokens.train += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        return super()._compute_loss(model, inputs)

    def gf_state(self) -> dict:
        return {"tokens": self.tokens.state_dict()}

    def gf_load_state(self, s: dict) -> None:
        self.tokens.load_state_dict(s["tokens"])


def _right_pad(seqs: list[list[int]], pad: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    length = length or max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
    return ids, mask


def _pad_to(t: torch.Tensor, length: int, value: int) -> torch.Tensor:
    if t.size(1) >= length:
        return t
    return torch.nn.functional.pad(t, (0, length - t.size(1)), value=value)


class MixedPolicyTrainer(GFGRPOTrainer):
    """GRPOTrainer whose batch also carries each prompt's expert demonstration; subclasses define the loss.

    Requirements (checked): one policy update per generation (num_iterations 1, steps_per_generation 1,
    GA 1), no KL term (beta 0). Then old log-probs equal current ones and the whole generation batch is one
    micro-batch, so every token mean below is the global token mean of the step.
    """

    method = "mixed"

    def __init__(self, *args, mixed=None, **kwargs):
        super().__init__(*args, **kwargs)
        a = self.args
        if a.num_iterations != 1 or a.steps_per_generation != 1 or a.gradient_accumulation_steps != 1:
            raise ValueError("mixed-policy trainers need num_iterations = steps_per_generation = GA = 1")
        if a.beta != 0.0:
            raise ValueError("mixed-policy trainers run without a KL term (beta = 0)")
        self.mixed = mixed
        self.eos_id = self.processing_class.eos_token_id
        self.pad_id = self.processing_class.pad_token_id

    # --------------------------------------------------------------- batch assembly
    def _demo_ids(self, demos: list[str]) -> list[list[int]]:
        enc = self.processing_class(demos, add_special_tokens=False)["input_ids"]
        return [ids + [self.eos_id] for ids in enc]

    def _rewards(self, completion_ids: torch.Tensor, completion_mask: torch.Tensor, answers: list[str]):
        # only the masked-in tokens of each row (no assumption about the pad token's id)
        rows = [ids[m.bool()].tolist() for ids, m in zip(completion_ids, completion_mask, strict=True)]
        texts = self.processing_class.batch_decode(rows, skip_special_tokens=True)
        check = getattr(self, "check", is_correct)
        return torch.tensor([float(check(t, a)) for t, a in zip(texts, answers, strict=True)])

    def _generate_and_score_completions(self, inputs):
        out = GRPOTrainer._generate_and_score_completions(self, inputs)
        if not self.model.training:
            return out
        g = self.num_generations
        demo_ids, demo_mask = _right_pad(self._demo_ids([x["solution"] for x in inputs]), self.pad_id)
        out["demo_ids"], out["demo_mask"] = demo_ids, demo_mask
        out["rewards"] = self._rewards(out["completion_ids"], out["completion_mask"], [x["answer"] for x in inputs])
        n = len(inputs)
        out["group_first"] = torch.tensor([i % g == 0 for i in range(n)])
        n_correct = out["rewards"].view(-1, g).sum(dim=1).repeat_interleave(g)
        out["group_correct"] = n_correct
        generated = {"prompt_mask": out["prompt_mask"], "completion_mask": out["completion_mask"]}
        self._count_generation(generated)  # every rollout generated, before any method replaces one
        self.extend_batch(out, inputs)
        return out

    def extend_batch(self, out: dict, inputs: list[dict]) -> None:
        """Method-specific changes to the generation batch (before TRL shuffles and splits it)."""

    # --------------------------------------------------------------- loss
    def _logps(self, model, prompt_ids, prompt_mask, comp_ids, comp_mask, entropy=False):
        ids = torch.cat([prompt_ids, comp_ids], dim=1)
        mask = torch.cat([prompt_mask, comp_mask], dim=1)
        logps, ent, _ = self._get_per_token_logps_and_entropies(
            model, ids, mask, comp_ids.size(1), compute_entropy=entropy)
        self.tokens.train += int(mask.sum())
        return logps, ent

    def _demo_logps(self, model, inputs, rows: torch.Tensor) -> torch.Tensor:
        """Per-token log-probs of the demonstrations on the selected rows only (B, T_demo; zero elsewhere):
        the forward, and its token count for FLOPs, runs once per row that needs it."""
        full = torch.zeros(inputs["demo_ids"].shape, dtype=torch.float32, device=inputs["demo_ids"].device)
        if not bool(rows.any()):
            return full
        sub, _ = self._logps(model, inputs["prompt_ids"][rows], inputs["prompt_mask"][rows],
                             inputs["demo_ids"][rows], inputs["demo_mask"][rows])
        self.tokens.demo += int(inputs["prompt_mask"][rows].sum() + inputs["demo_mask"][rows].sum())
        full = full.to(sub.dtype)
        full[rows] = sub
        return full

    def _compute_loss(self, model, inputs):
        loss = self.method_loss(model, inputs)
        self._metrics["train"]["mixed/loss"].append(float(loss.detach()))
        return loss

    def method_loss(self, model, inputs) -> torch.Tensor:
        raise TypeError(f"{type(self).__name__} must define method_loss")


class LuffyTrainer(MixedPolicyTrainer):
    """LUFFY (Yan et al. 2025, "Learning to Reason under Off-Policy Guidance", arXiv:2504.14945).

    The expert demonstration joins each GRPO group as an off-policy sample (it replaces one of the G rollouts, as
    LUFFY's G-1 on-policy + 1 off-policy groups); advantages are r - group mean, without std normalisation; the
    off-policy tokens are trained with the shaped probability f(p) = p / (p + gamma), gamma = 0.1, unclipped
    (losses.luffy_tokens). FLOPs: this implementation generates all G rollouts and discards the replaced one, so
    the discarded generation is counted (what was computed, not what LUFFY's own G-1 sampler would cost).
    """

    method = "luffy"

    def extend_batch(self, out, inputs):
        g = self.num_generations
        n = len(inputs)
        off = torch.tensor([i % g == g - 1 for i in range(n)])
        demo_ids, demo_mask = out["demo_ids"], out["demo_mask"]
        length = max(out["completion_ids"].size(1), demo_ids.size(1))
        comp = _pad_to(out["completion_ids"], length, self.pad_id)
        cmask = _pad_to(out["completion_mask"], length, 0)
        comp[off] = _pad_to(demo_ids, length, self.pad_id)[off]
        cmask[off] = _pad_to(demo_mask, length, 0)[off]
        out["completion_ids"], out["completion_mask"] = comp, cmask
        rewards = out["rewards"].clone()
        rewards[off] = self._rewards(comp[off], cmask[off], [inputs[i]["answer"] for i in range(n) if off[i]])
        out["rewards"] = rewards
        out["advantages"] = losses.group_advantages(rewards, g, scale=False)
        out["off_policy"] = off
        self._metrics["train"]["luffy/on_policy_reward"].append(float(rewards[~off].mean()))

    def method_loss(self, model, inputs):
        logps, _ = self._logps(model, inputs["prompt_ids"], inputs["prompt_mask"],
                               inputs["completion_ids"], inputs["completion_mask"])
        off = inputs["off_policy"]
        self.tokens.demo += int(inputs["prompt_mask"][off].sum() + inputs["completion_mask"][off].sum())
        per_token = losses.luffy_tokens(logps, inputs["advantages"], off, self.mixed.luffy_gamma)
        return losses.masked_mean(per_token, inputs["completion_mask"])


class SRFTTrainer(MixedPolicyTrainer):
    """SRFT (Fu et al. 2025, "SRFT: A Single-Stage Method with Supervised and Reinforcement Fine-Tuning for
    Reasoning", arXiv:2506.19767).

    One stage: SFT on the demonstrations weighted by 0.5 * exp(-H) plus GRPO on the rollouts with correct
    rollouts weighted by 0.1 * exp(+H), H the policy's mean token entropy on its rollouts (no gradient through
    the weights; losses.srft_loss).
    """

    method = "srft"

    def method_loss(self, model, inputs):
        logps, ent = self._logps(model, inputs["prompt_ids"], inputs["prompt_mask"],
                                 inputs["completion_ids"], inputs["completion_mask"], entropy=True)
        # one demonstration per prompt: the batch holds G copies of it; run the forward once per distinct
        # demonstration (the `group_first` rows). The token mean over them equals the mean over all G copies.
        first = inputs["group_first"]
        demo_logps = self._demo_logps(model, inputs, first)
        h = losses.masked_mean(ent, inputs["completion_mask"])
        w_sft, w_pos = losses.srft_weights(h, self.mixed.srft_sft_coef, self.mixed.srft_pos_coef)
        self._metrics["train"]["srft/entropy"].append(float(h))
        self._metrics["train"]["srft/w_sft"].append(float(w_sft))
        return losses.srft_loss(logps, inputs["completion_mask"], inputs["advantages"], inputs["rewards"],
                                demo_logps, inputs["demo_mask"] * first[:, None], h, self.mixed.srft_sft_coef,
                                self.mixed.srft_pos_coef)


class ReLIFTTrainer(MixedPolicyTrainer):
    """ReLIFT (Ma et al. 2025, "Learning What Reinforcement Learning Can't: Interleaved Online Fine-Tuning for
    Hardest Questions", arXiv:2506.07527).

    GRPO by default; every prompt whose G rollouts all fail goes, with its demonstration, into a buffer; when the
    buffer holds `relift_buffer_size` prompts, their NLL (token mean) is added to that step's loss and the
    buffer empties (losses.HardestBuffer). Deviation: the fine-tuning step shares the optimizer step with the RL
    loss instead of being a separate optimizer step (same gradient sum, one fewer Adam update).
    """

    method = "relift"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.buffer = losses.HardestBuffer(self.mixed.relift_buffer_size)

    def extend_batch(self, out, inputs):
        self.buffer.add_failed_groups([x["prompt"] for x in inputs], [x["solution"] for x in inputs],
                                      out["rewards"].tolist(), self.num_generations)

    def method_loss(self, model, inputs):
        logps, _ = self._logps(model, inputs["prompt_ids"], inputs["prompt_mask"],
                               inputs["completion_ids"], inputs["completion_mask"])
        loss = losses.masked_mean(losses.policy_gradient_tokens(logps, inputs["advantages"]),
                                  inputs["completion_mask"])
        batch = self.buffer.pop_full()
        self._metrics["train"]["relift/sft_step"].append(float(batch is not None))
        if batch is not None:
            tok = self.processing_class
            p = tok([b[0] for b in batch], add_special_tokens=False, padding=True, return_tensors="pt")
            d_ids, d_mask = _right_pad(self._demo_ids([b[1] for b in batch]), self.pad_id)
            demo_logps, _ = self._logps(model, p["input_ids"], p["attention_mask"], d_ids, d_mask)
            self.tokens.demo += int(p["attention_mask"].sum() + d_mask.sum())
            loss = loss + losses.masked_mean(losses.nll_tokens(demo_logps), d_mask)
        return loss

    def gf_state(self):
        return {**super().gf_state(), "buffer": self.buffer.state_dict()}

    def gf_load_state(self, s):
        super().gf_load_state(s)
        self.buffer.load_state_dict(s["buffer"])


class HPTTrainer(MixedPolicyTrainer):
    """HPT, Hybrid Post-Training (Lv et al. 2025, "Towards a Unified View of Large Language Model
    Post-Training", arXiv:2509.04419).

    Per prompt: if the group solved it at most `hpt_gate` times (default 0), train SFT on its demonstration;
    otherwise GRPO on its rollouts (losses.hpt_gate, losses.hpt_loss).
    """

    method = "hpt"

    def method_loss(self, model, inputs):
        logps, _ = self._logps(model, inputs["prompt_ids"], inputs["prompt_mask"],
                               inputs["completion_ids"], inputs["completion_mask"])
        use_sft = losses.hpt_gate(inputs["group_correct"], self.mixed.hpt_gate)
        demo_row = inputs["group_first"]
        self._metrics["train"]["hpt/sft_fraction"].append(float(use_sft.float().mean()))
        # the demonstration forward only for gated prompts, once per prompt (one `group_first` row each)
        demo_logps = self._demo_logps(model, inputs, use_sft & demo_row)
        return losses.hpt_loss(logps, inputs["completion_mask"], inputs["advantages"], use_sft,
                               demo_logps, inputs["demo_mask"], demo_row)


MIXED_TRAINERS = {"luffy": LuffyTrainer, "srft": SRFTTrainer, "relift": ReLIFTTrainer, "hpt": HPTTrainer}
