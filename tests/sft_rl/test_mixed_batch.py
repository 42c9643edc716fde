"""LUFFY's batch surgery: the demonstration replaces the last rollout of each group, earns its reward, and the
advantages are recomputed as r - group mean (no std), on a hand-made generation batch."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from gradfidelity.studies.sft_rl.models import build_tokenizer
from gradfidelity.studies.sft_rl.task import is_correct
from gradfidelity.studies.sft_rl.trainers import LuffyTrainer, MixedPolicyTrainer, _right_pad


def _fake_trainer(tok, g):
    t = SimpleNamespace(num_generations=g, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, processing_class=tok,
                        check=is_correct, _metrics={"train": defaultdict(list)})
    t._rewards = MixedPolicyTrainer._rewards.__get__(t)
    t._demo_ids = MixedPolicyTrainer._demo_ids.__get__(t)
    return t


def test_luffy_replaces_last_rollout_with_demonstration():
    tok = build_tokenizer()
    g = 3
    inputs = [{"prompt": "1+1=", "solution": "1+1=2#2", "answer": "2"}] * g + \
             [{"prompt": "3-1=", "solution": "3-1=2#2", "answer": "2"}] * g
    completions = ["1+1=2#2", "#5", "#7", "#0", "#1", "#9"]   # group 1: one correct; group 2: none
    comp_ids, comp_mask = _right_pad([tok(c, add_special_tokens=False)["input_ids"] for c in completions],
                                     tok.pad_token_id)
    t = _fake_trainer(tok, g)
    demo_ids, demo_mask = _right_pad(t._demo_ids([x["solution"] for x in inputs]), tok.pad_token_id)
    out = {"completion_ids": comp_ids, "completion_mask": comp_mask, "demo_ids": demo_ids, "demo_mask": demo_mask,
           "rewards": t._rewards(comp_ids, comp_mask, [x["answer"] for x in inputs])}
    assert out["rewards"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    LuffyTrainer.extend_batch(t, out, inputs)
    assert out["off_policy"].tolist() == [False, False, True, False, False, True]
    texts = tok.batch_decode(out["completion_ids"] * out["completion_mask"], skip_special_tokens=True)
    assert texts[2] == "1+1=2#2" and texts[5] == "3-1=2#2" and texts[0] == "1+1=2#2" and texts[1] == "#5"
    assert out["rewards"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert out["advantages"].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, -1 / 3, -1 / 3, 2 / 3])
    # the demonstration row ends with EOS and its mask covers exactly demo + EOS
    assert int(out["completion_mask"][2].sum()) == len("1+1=2#2") + 1
    assert torch.equal(out["completion_ids"][2][len("1+1=2#2")], torch.tensor(tok.eos_token_id))


def test_rewards_do_not_assume_pad_id_zero():
    """A tokenizer whose id 0 is a real character ('#'): masked-out tokens must not decode as that character."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tk_models
    from transformers import PreTrainedTokenizerFast

    vocab = {"#": 0}
    for ch in "0123456789+-*=, ":
        vocab[ch] = len(vocab)
    vocab.update({"<pad>": len(vocab), "<s>": len(vocab) + 1, "</s>": len(vocab) + 2})
    raw = Tokenizer(tk_models.WordLevel(vocab=vocab, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    raw.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<pad>")
    assert tok.pad_token_id != 0
    t = _fake_trainer(tok, 2)
    ids, mask = _right_pad([tok("#3", add_special_tokens=False)["input_ids"],
                            tok("#3", add_special_tokens=False)["input_ids"]], tok.pad_token_id, length=4)
    ids[1, 2:] = torch.tensor(tok("#4", add_special_tokens=False)["input_ids"])  # junk after the mask ends
    assert t._rewards(ids, mask, ["3", "3"]).tolist() == [1.0, 1.0]
