"""Embedded corpus, a text-file corpus with its BPE, FineWeb-Edu loader on a local parquet fixture, optimizer
registry."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import OPTIMIZERS
from gradfidelity.studies.async_pp.data import (
    CharTokenizer,
    check_epochs,
    embedded_corpus,
    embedded_stream,
    file_stream,
    fineweb_stream,
    load_prepared,
    prepare_file,
    split_blocks,
)
from gradfidelity.studies.async_pp.model import build_model, lm_loss
from gradfidelity.studies.async_pp.optimizers import REGISTRY, build_optimizer, lr_factor
from tests.async_pp._cfg import model_config


def test_embedded_corpus_is_deterministic_and_in_alphabet():
    a, b = embedded_corpus(5000, seed=0), embedded_corpus(5000, seed=0)
    assert a == b and len(a) == 5000 and a != embedded_corpus(5000, seed=1)
    assert set(a) <= set(CharTokenizer().alphabet)
    sums = re.findall(r"(\d+) plus (\d+) is (\d+)\.", a)
    assert sums and all(int(x) + int(y) == int(z) for x, y, z in sums)


def test_batches_are_a_pure_function_of_seed_and_step():
    s1 = embedded_stream(20000, 2000, 16, 4, seed=7)
    s2 = embedded_stream(20000, 2000, 16, 4, seed=7)
    x1, y1 = s1.batch(5)
    x2, y2 = s2.batch(5)
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(x1, s1.batch(6)[0])


def test_fineweb_loader_on_a_local_parquet_fixture(tmp_path):
    docs = ["the cat sees the dog.", "1 plus 2 is 3.", "anna lives near the sea."] * 20
    pd.DataFrame({"text": docs, "id": range(len(docs))}).to_parquet(tmp_path / "shard-000.parquet")
    tok = CharTokenizer()
    stream = fineweb_stream(str(tmp_path), tok, train_tokens=400, val_tokens=100, seq_len=8, batch_size=2, seed=0)
    expected = []
    for d in docs:
        expected += tok.encode(d) + [tok.eos_token_id]
    assert stream.val.tolist() == expected[:100]
    assert stream.train.tolist() == expected[100:500]
    pd.DataFrame({"content": docs}).to_parquet(tmp_path / "shard-000.parquet")
    with pytest.raises(UserError, match="no 'text' column"):
        fineweb_stream(str(tmp_path), tok, 400, 100, 8, 2, 0)
    with pytest.raises(UserError, match="fewer than"):
        pd.DataFrame({"text": docs[:2]}).to_parquet(tmp_path / "shard-000.parquet")
        fineweb_stream(str(tmp_path), tok, 400, 100, 8, 2, 0)


def test_registry_names_and_momentum_mapping():
    assert tuple(REGISTRY) == OPTIMIZERS
    cfg = model_config(vocab_size=40, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=8)
    m = build_model(cfg, 0)
    named = list(m.named_parameters())
    where = {"adamw": lambda g: g["betas"][0], "muon": lambda g: g["momentum"], "muon_all": lambda g: g["momentum"],
             "soap": lambda g: g["betas"][0],
             "adan": lambda g: g["betas"][0], "lion": lambda g: g["betas"][1], "mars": lambda g: g["betas"][0]}
    for name in OPTIMIZERS:
        opt = build_optimizer(name, named, momentum=0.77)
        groups = [g for g in opt.param_groups if g.get("use_muon", True)]
        assert all(where[name](g) == 0.77 for g in groups), name
        if name == "adamw":  # beta2 moves with beta1: 1 - beta2 = (1 - beta1) / 2
            assert all(g["betas"][1] == pytest.approx(0.885) for g in groups)
        x, y = torch.randint(0, 40, (2, 8)), torch.randint(0, 40, (2, 8))
        before = [p.detach().clone() for p in m.parameters()]
        lm_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        changed = any(not torch.equal(a, p) for a, p in zip(before, m.parameters(), strict=True))
        assert changed or name == "soap", name  # SOAP skips its first update (reference behaviour)
    muon = build_optimizer("muon", named)
    flags = {id(p): g["use_muon"] for g in muon.param_groups for p in g["params"]}
    assert flags[id(m.embed_tokens.weight)] is False
    assert flags[id(m.layers[0].self_attn.q_proj.weight)] is True
    with pytest.raises(UserError, match="not in"):
        build_optimizer("sgd", named)


def test_muon_all_orthogonalises_the_embedding_and_head_update_where_muon_gives_them_to_adamw():
    """The issue-60 arm: under `muon_all` the embedding's and the head's first update is an orthogonalised matrix
    (Newton-Schulz: its singular values close to each other, checked with torch.linalg.svdvals), under `muon` it is
    AdamW's (a first Adam step is lr * sign(g) per entry, whose singular values spread as a random sign matrix's)."""
    cfg = model_config(vocab_size=40, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=8,
                       tie_embeddings=False)
    spread = {}
    for name in ("muon", "muon_all"):
        m = build_model(cfg, 0, dtype=torch.float64)
        named = list(m.named_parameters())
        opt = build_optimizer(name, named, lr=1e-2)
        flags = {id(p): g["use_muon"] for g in opt.param_groups for p in g["params"]}
        assert flags[id(m.embed_tokens.weight)] is (name == "muon_all")
        assert flags[id(m.lm_head.weight)] is (name == "muon_all")
        assert flags[id(m.norm.weight)] is False  # the gains stay with AdamW in both
        before = {n: p.detach().clone() for n, p in named}
        for n, p in named:
            p.grad = torch.randn(p.shape, dtype=p.dtype, generator=torch.Generator().manual_seed(len(n)))
        opt.step()
        for n in ("embed_tokens.weight", "lm_head.weight"):
            delta = dict(named)[n].detach() - before[n]
            sv = torch.linalg.svdvals(delta)
            spread[name, n] = float(sv.max() / sv.min())
    for n in ("embed_tokens.weight", "lm_head.weight"):
        assert spread["muon_all", n] < 2.0 < spread["muon", n], spread


def test_wsd_schedule():
    f = [lr_factor(t, 10, 2, 4) for t in range(10)]
    assert f[0] == 0.5 and f[1] == 1.0 and f[5] == 1.0
    assert f[9] == pytest.approx(0.1) and f[6] == pytest.approx(1 - 0.9 * 0.25)


def test_wsd_stable_and_decay_phases_match_transformers():
    """The independent reference: transformers' WSD schedule, evaluated after t+1 steps, on the stable and decay
    phases (its warmup starts from min_lr_ratio, ours from 0: the docstring of lr_factor says why ours is kept)."""
    from transformers import get_wsd_schedule

    total, warmup, decay = 200, 10, 40
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_wsd_schedule(opt, num_warmup_steps=warmup, num_decay_steps=decay, num_training_steps=total,
                           min_lr_ratio=0.1, decay_type="linear").lr_lambdas[0]
    for t in range(warmup, total):
        assert lr_factor(t, total, warmup, decay) == pytest.approx(ref(t + 1), abs=1e-12), t
    assert lr_factor(0, total, warmup, decay) == pytest.approx(1 / warmup)  # ours, from 0 (ref(1) = 0.19)


def _one_step(name, named, zero_grad_for=()):
    opt = build_optimizer(name, named)
    for n, p in named:
        p.grad = torch.zeros_like(p) if n in zero_grad_for else torch.ones_like(p)
    opt.step()
    return opt


def test_mars_does_not_decay_1d_gains():
    cfg = model_config(vocab_size=40, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=8)
    m = build_model(cfg, 0)
    named = list(m.named_parameters())
    gains = [n for n, p in named if p.ndim == 1]
    before = {n: p.detach().clone() for n, p in named}
    _one_step("mars", named, zero_grad_for=set(gains))
    for n, p in named:
        if n in gains:  # zero gradient, no decay: unchanged (pytorch-optimizer's default would shrink them)
            assert torch.equal(p.detach(), before[n]), n
    opt = build_optimizer("mars", named)
    assert all(g["weight_decay_1d"] == 0.0 for g in opt.param_groups)


def test_muon_lr_is_width_adjusted():
    """use_adjusted_lr: the per-entry RMS of an orthogonalised update is 0.2 lr at any width (Moonlight)."""
    rms = {}
    for d in (16, 64):
        cfg = model_config(vocab_size=40, d_model=d, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=2 * d, max_seq_len=8)
        m = build_model(cfg, 0, dtype=torch.float64)
        named = list(m.named_parameters())
        w = m.layers[0].mlp.up_proj.weight
        before = w.detach().clone()
        opt = build_optimizer("muon", named, lr=1e-2)
        assert all(g["use_adjusted_lr"] for g in opt.param_groups if g["use_muon"])
        for _, p in named:
            p.grad = torch.randn(p.shape, dtype=p.dtype, generator=torch.Generator().manual_seed(d))
        opt.step()
        rms[d] = float((w.detach() - before).pow(2).mean().sqrt())
    assert rms[16] == pytest.approx(rms[64], rel=0.25)  # Keller Jordan's factor would differ by ~2x here
    assert rms[64] == pytest.approx(0.2 * 1e-2, rel=0.25)


def test_the_lr_grid_grows_past_a_winning_edge_until_the_optimum_is_bracketed():
    """A made-up loss surface whose optimum (12x) lies above the grid: 2x steps past the edge, one round at a time,
    until the best point has a worse neighbour on both sides; the low edge the same way; a diverged neighbour
    brackets too."""
    from gradfidelity.studies.async_pp.lr_select import choose, extension

    def surface(m):
        return (math.log2(m) - math.log2(12.0)) ** 2

    grid = {m: surface(m) for m in (0.5, 1, 2, 4)}
    added = []
    while new := extension(grid):
        added += new
        grid.update({m: surface(m) for m in new})
    assert added == [8.0, 16.0, 32.0] and choose(grid) == 16.0
    low = {m: (math.log2(m) + 3) ** 2 for m in (0.5, 1, 2, 4)}  # optimum at 1/8
    assert extension(low) == [0.25]
    assert extension({1: 2.0, 2: 1.0, 4: math.nan}) == []



# ----------------------------------------------------------------------------------------------- a text file corpus
def _text(n_lines: int = 20000) -> str:
    rng = np.random.default_rng(0)
    words = ["the", "module", "returns", "a", "list", "of", "strings", "function", "argument", "default", "value",
             "raises", "ValueError", "when", "is", "not", "None", "import", "os", "path"]
    return "".join(" ".join(rng.choice(words, size=int(rng.integers(3, 12)))) + ".\n" for _ in range(n_lines))


def test_a_text_file_is_split_tokenized_and_checked_before_use(tmp_path):
    src = tmp_path / "docs.txt"
    src.write_text(_text(), encoding="utf-8")
    meta = prepare_file(src, tmp_path / "a", vocab_size=300, val_fraction=0.2)
    assert meta["vocab_size"] == 300 and meta["sizes"]["train"] > 3 * meta["sizes"]["val"] > 0
    train, val, _ = load_prepared(tmp_path / "a")
    tok = Tokenizer.from_file(str(tmp_path / "a" / "tokenizer.json"))
    assert tok.decode(train[:200].tolist()) == src.read_text()[:len(tok.decode(train[:200].tolist()))]
    # the same text gives the same tokenizer and ids (a rerun of the data rule repeats bit for bit)
    prepare_file(src, tmp_path / "b", vocab_size=300, val_fraction=0.2)
    assert (tmp_path / "a" / "train.bin").read_bytes() == (tmp_path / "b" / "train.bin").read_bytes()
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    # held-out blocks are interleaved through the text, none of them in the training split
    tr_blocks, val_blocks = split_blocks(src.read_text(), 0.2, block=4096)
    assert len(val_blocks) >= 2 and not set(val_blocks) & set(tr_blocks)
    # a damaged or truncated split fails before any run reads it, naming the file
    data = (tmp_path / "a" / "train.bin").read_bytes()
    (tmp_path / "a" / "train.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"train.bin: \d+ tokens with MD5 .*damaged or truncated"):
        load_prepared(tmp_path / "a")
    flipped = bytearray(data)
    flipped[10] ^= 0xFF
    (tmp_path / "a" / "train.bin").write_bytes(bytes(flipped))
    with pytest.raises(UserError, match="damaged or truncated"):
        load_prepared(tmp_path / "a")
    (tmp_path / "bin.dat").write_bytes(bytes(range(256)) * 10)
    with pytest.raises(UserError, match="not UTF-8"):
        prepare_file(tmp_path / "bin.dat", tmp_path / "c", 300, 0.2)


def test_a_run_that_would_repeat_the_text_is_refused(tmp_path):
    src = tmp_path / "docs.txt"
    src.write_text(_text(), encoding="utf-8")
    prepare_file(src, tmp_path / "d", vocab_size=300, val_fraction=0.2)
    stream = file_stream(tmp_path / "d", seq_len=16, batch_size=4, seed=0)
    n = stream.train.numel()
    assert check_epochs(stream, n // 64 // 2, 1.0) == pytest.approx((n // 64 // 2) * 64 / n)
    with pytest.raises(UserError, match="async_pp.data.max_epochs: .* draw 2.0"):
        check_epochs(stream, 2 * n // 64, 1.0)
    assert check_epochs(stream, 2 * n // 64, 0) > 1  # 0 = no limit (the embedded smoke corpus)
