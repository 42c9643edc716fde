"""The guard's loss-normalisation check (ds_audit/loss_check.py) on TRL's SFTTrainer, no DeepSpeed: a tiny Llama built
from a config and a character tokenizer (as trl_guard_script.py), GA 4, texts of clearly different lengths.

It must pass TRL's own loss, fail the per-micro-batch mean (this repository's GFSFTTrainer(per_micro_mean=True)) and
the transformers "num_items_in_batch ignored" class of bug, say "cannot tell" on equal lengths, leave training
bit-identical, and its reference must match a one-batch gradient computed here independently."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from gradfidelity.studies.ds_audit.loss_check import (  # noqa: E402
    TOLERANCE,
    check_window_gradient,
    reference_gradient,
)
from gradfidelity.studies.sft_rl.trainers import GFSFTTrainer  # noqa: E402

GA = 4
CHARS = "abcdefghijklmnopqrstuvwxyz ="
VOCAB = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
# 2 + 3 i characters after the prompt: 6 to 30 label tokens, all different
VARIED = [f"ab = {c * (2 + 3 * i)}" for i, c in enumerate(CHARS[:10])]
EQUAL = [f"ab = {c * 6}" for c in CHARS[:12]]


def _tokenizer():
    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _trainer(tmp_path, cls=SFTTrainer, texts=VARIED, bs=1, ga=GA, bf16=False, max_steps=1, callbacks=None,
             dropout=0.0, seedable_sampler=True, **kw):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=64, attention_dropout=dropout))
    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
                     max_steps=max_steps, learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[],
                     use_cpu=True, bf16=bf16, max_length=48, dataloader_num_workers=0, disable_tqdm=True, seed=7,
                     accelerator_config={"use_seedable_sampler": seedable_sampler})
    return cls(model=model, args=args, train_dataset=Dataset.from_dict({"text": texts}),
               processing_class=_tokenizer(), callbacks=callbacks, **kw)


class MeanPerMicroBatch(SFTTrainer):
    """The transformers gradient-accumulation bug class: compute_loss ignores num_items_in_batch and returns the
    model's own per-micro-batch token mean; with model_accepts_loss_kwargs False the Trainer divides it by GA."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=inputs["labels"])
        return (out.loss, out) if return_outputs else out.loss


def _first_window(trainer, ga=GA) -> list[dict]:
    """The first accumulation window of a fresh training dataloader (the seedable sampler repeats its order)."""
    it = iter(trainer.get_train_dataloader())
    return [next(it) for _ in range(ga)]


def _params(model):
    return [p for p in model.parameters() if p.requires_grad]


def _nll_sum_grads(model, batch) -> tuple[list[torch.Tensor], int]:
    """Independent of the module: the gradient of the summed next-token NLL of one micro-batch, and its tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=-100,
                          reduction="sum")
    return list(torch.autograd.grad(nll, _params(model))), int((labels != -100).sum())


def _norm(gs) -> float:
    return math.sqrt(sum(float(g.pow(2).sum()) for g in gs))


def _rel(a, b) -> float:
    return math.sqrt(sum(float((x - y).pow(2).sum()) for x, y in zip(a, b, strict=True))) / _norm(b)


def _expected_per_micro_mean_ratio(trainer) -> tuple[float, float, list[int]]:
    """By hand: ||sum_m g_m / (GA n_m)|| / ||sum_m g_m / N|| and the relative error, g_m the summed-NLL gradient of
    micro-batch m with n_m label tokens, N = sum n_m."""
    parts = [_nll_sum_grads(trainer.model, b) for b in _first_window(trainer)]
    n_total = sum(n for _, n in parts)
    ref = [sum(g[i] for g, _ in parts) / n_total for i in range(len(parts[0][0]))]
    bug = [sum(g[i] / (GA * n) for g, n in parts) for i in range(len(parts[0][0]))]
    return _norm(bug) / _norm(ref), _rel(bug, ref), [n for _, n in parts]


def test_correct_sft_trainer_passes(tmp_path):
    tr = _trainer(tmp_path)
    r = check_window_gradient(tr)
    assert r.ok is True, r.message()
    assert r.tolerance == TOLERANCE[torch.float32] == 1e-3
    assert r.rel_error < r.tolerance and abs(r.ratio - 1) < r.tolerance and r.cosine > 1 - r.tolerance
    assert r.micro_batches == GA and len(set(r.tokens)) > 1 and r.normalise == "token"
    assert "ok: the loss is normalised over the whole accumulation window" in r.message()
    assert all(p.grad is None for p in tr.model.parameters())


def test_per_micro_batch_mean_fails(tmp_path):
    tr = _trainer(tmp_path, cls=GFSFTTrainer, per_micro_mean=True)
    expect_ratio, expect_rel, tokens = _expected_per_micro_mean_ratio(tr)
    r = check_window_gradient(tr)
    assert r.tokens == tokens  # the same window as the hand computation
    assert r.ok is False, r.message()
    assert r.rel_error > 10 * r.tolerance
    assert r.ratio == pytest.approx(expect_ratio, rel=1e-4) and r.rel_error == pytest.approx(expect_rel, rel=1e-3)
    assert abs(r.ratio - 1) > 0.05
    assert "token mean per micro-batch, divided by GA" in r.message()


def test_ignored_num_items_in_batch_fails(tmp_path):
    tr = _trainer(tmp_path, cls=MeanPerMicroBatch)
    tr.model_accepts_loss_kwargs = False  # the Trainer now divides the micro-batch mean by GA itself
    expect_ratio, expect_rel, _ = _expected_per_micro_mean_ratio(tr)
    r = check_window_gradient(tr)
    assert r.ok is False, r.message()
    assert r.rel_error > 10 * r.tolerance
    assert r.ratio == pytest.approx(expect_ratio, rel=1e-4) and r.rel_error == pytest.approx(expect_rel, rel=1e-3)


def test_equal_lengths_cannot_tell(tmp_path):
    tr = _trainer(tmp_path, cls=GFSFTTrainer, texts=EQUAL, per_micro_mean=True)
    r = check_window_gradient(tr, max_windows=3)
    assert r.ok is None, r.message()
    assert r.windows_tried == 3 and len(set(r.tokens)) == 1
    assert r.rel_error < r.tolerance  # the bug is invisible here, as said
    assert "cannot tell" in r.message() and "same label-token count" in r.message()


def test_ga_one_is_checked_and_passes(tmp_path):
    r = check_window_gradient(_trainer(tmp_path, ga=1))
    assert r.ok is True and r.micro_batches == 1 and r.rel_error < r.tolerance
    assert "gradient accumulation is 1" in r.message()


def test_sequence_normalisation(tmp_path):
    """One sequence per micro-batch: the per-sequence mean IS a token mean per micro-batch divided by GA, so the
    per-micro-batch mean matches it (undecided: every micro-batch has one sequence) and TRL's token mean does not."""
    r_bug = check_window_gradient(_trainer(tmp_path, cls=GFSFTTrainer, per_micro_mean=True), normalise="sequence")
    assert r_bug.ok is None and r_bug.rel_error < r_bug.tolerance, r_bug.message()
    r_trl = check_window_gradient(_trainer(tmp_path), normalise="sequence")
    assert r_trl.ok is False and r_trl.rel_error > 10 * r_trl.tolerance, r_trl.message()


@pytest.mark.parametrize("normalise", ["token", "sequence"])
def test_reference_is_the_one_batch_gradient(tmp_path, normalise):
    """The reference against a literal one batch: the window's 8 sequences right-padded into one batch, one forward,
    the mean over all label tokens (token) or the mean of per-sequence token means (sequence)."""
    tr = _trainer(tmp_path, bs=2)
    window = _first_window(tr)
    rows = [(ids[m.bool()], lab[m.bool()]) for b in window
            for ids, m, lab in zip(b["input_ids"], b["attention_mask"], b["labels"], strict=True)]
    length = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (x, y) in enumerate(rows):
        ids[i, :len(x)], mask[i, :len(x)], labels[i, :len(y)] = x, 1, y
    assert len({len(x) for x, _ in rows}) > 2
    logits = tr.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    tgt = labels[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1), ignore_index=-100,
                          reduction="none").view(tgt.shape)
    valid = tgt != -100
    if normalise == "token":
        loss = nll.sum() / valid.sum()
    else:
        loss = (nll.sum(-1) / valid.sum(-1)).mean()
    expected = torch.autograd.grad(loss, _params(tr.model))
    got = reference_gradient(tr, window, normalise=normalise)
    assert _rel(got, expected) < 1e-5
    assert all(p.grad is None for p in tr.model.parameters())


class _CheckAtTrainBegin(TrainerCallback):
    def __init__(self):
        self.trainer, self.result, self.grads_none, self.step_kept, self.accelerator_kept = None, None, None, None, None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        acc = self.trainer.accelerator
        before = (state.global_step, list(acc._dataloaders), acc.gradient_state.dataloader_references, dict(
            sync=acc.gradient_state.sync_gradients, end=acc.gradient_state.end_of_dataloader), acc.__dict__.get(
            "backward"))
        self.result = check_window_gradient(self.trainer, model=model)
        self.grads_none = all(p.grad is None for p in model.parameters())
        self.step_kept = state.global_step == before[0]
        self.accelerator_kept = (acc._dataloaders == before[1] and acc.gradient_state.dataloader_references == before[2]
                                 and before[3] == dict(sync=acc.gradient_state.sync_gradients,
                                                       end=acc.gradient_state.end_of_dataloader)
                                 and acc.__dict__.get("backward") is before[4])


def test_check_leaves_training_untouched(tmp_path):
    """Two optimizer steps with the check at on_train_begin give bit-identical parameters and logs to the same two
    steps without it. Made sensitive: bf16 autocast (as the Trainer prepares the model), attention dropout (draws
    from the global RNG; the check must also seed its two passes alike to pass), a plain RandomSampler (draws its
    order from the global RNG when the real loop starts iterating, after the check), TRL's logged metrics."""
    cb = _CheckAtTrainBegin()
    common = dict(bf16=True, max_steps=2, dropout=0.3, seedable_sampler=False)
    with_check = _trainer(tmp_path / "a", callbacks=[cb], **common)
    cb.trainer = with_check
    with_check.train()
    without = _trainer(tmp_path / "b", **common)
    without.train()

    r = cb.result
    assert r is not None and r.ok is True, r.message()
    assert r.tolerance == TOLERANCE[torch.bfloat16]
    assert cb.grads_none and cb.step_kept and cb.accelerator_kept
    assert with_check.state.global_step == without.state.global_step == 2
    a, b = with_check.model.state_dict(), without.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("loss", "grad_norm", "learning_rate", "num_tokens", "mean_token_accuracy", "entropy")
    logs = [[{k: e[k] for k in keys if k in e} for e in t.state.log_history if "loss" in e]
            for t in (with_check, without)]
    assert logs[0] == logs[1] and len(logs[0]) == 2


# ------------------------------------------------------------------ the guard's second mode, end to end
def test_guard_gradient_mode_stops_a_per_micro_batch_mean_before_the_first_step(tmp_path):
    from gradfidelity.guard import DeepSpeedAuditCallback, DeepSpeedAuditError

    trainer = _trainer(tmp_path, cls=GFSFTTrainer, per_micro_mean=True, max_steps=2)
    DeepSpeedAuditCallback.install(trainer, gradient_check=True)
    with pytest.raises(DeepSpeedAuditError) as exc:
        trainer.train()
    msg = str(exc.value)
    assert "not normalised over the accumulation window" in msg and "x the one-batch gradient" in msg
    assert trainer.state.global_step == 0
    assert all(len(line) < 300 for line in msg.splitlines())


def test_guard_gradient_mode_lets_a_correct_trainer_train(tmp_path):
    from gradfidelity.guard import DeepSpeedAuditCallback

    trainer = _trainer(tmp_path, max_steps=2)
    cb = DeepSpeedAuditCallback.install(trainer, gradient_check=True)
    trainer.train()
    assert trainer.state.global_step == 2 and cb.window_check.ok is True
    assert cb.result is None  # no DeepSpeed: the config audit has nothing to audit


def test_guard_gradient_mode_without_the_trainer_is_a_clear_error(tmp_path):
    from gradfidelity.guard import DeepSpeedAuditCallback, DeepSpeedAuditError

    trainer = _trainer(tmp_path, callbacks=[DeepSpeedAuditCallback(gradient_check=True)])
    with pytest.raises(DeepSpeedAuditError, match=r"install\(trainer, gradient_check=True\)"):
        trainer.train()
