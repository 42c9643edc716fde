"""Token streams for study B: an EMBEDDED synthetic corpus (smoke/cpu) and a FineWeb-Edu loader (paper).

Why a generated corpus: no network at run time, and a char-level corpus with real structure (agreement, fixed
facts, arithmetic) gives a loss curve that keeps falling for a few thousand steps on a tiny model, which is what a
sync-vs-delayed comparison needs. It is labelled `embedded` everywhere; it is NOT FineWeb-Edu, so absolute losses
are not comparable with the paper's.

Batches are a pure function of (seed, step): a resumed run draws the same batches without saving any data state,
and every pipeline process draws the same micro-batches as the single-process simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import DataConfig

ALPHABET = "\n ,.0123456789abcdefghijklmnopqrstuvwxyz"
_NOUNS = ["cat", "dog", "bird", "fish", "horse", "tree", "river", "stone", "child", "king", "queen", "ship",
          "garden", "house", "road", "cloud", "farmer", "teacher", "wolf", "lamp"]
_ADJS = ["red", "green", "blue", "old", "young", "small", "large", "quiet", "bright", "dark", "warm", "cold"]
_VERBS = ["sees", "likes", "follows", "finds", "helps", "watches", "carries", "paints"]
_NAMES = ["anna", "boris", "clara", "dmitri", "elena", "farid", "greta", "hugo"]
_PLACES = ["the hill", "the town", "the forest", "the sea", "the valley", "the market"]


def embedded_corpus(n_chars: int, seed: int) -> str:
    """Deterministic English-like text. Each noun has a fixed colour and each name a fixed home (facts to learn),
    sentences follow a few templates, and sums are always correct (structure a small model can pick up)."""
    rng = np.random.default_rng(seed)
    fact_rng = np.random.default_rng(12345)  # the 'world' is the same for every split and seed
    colour = {n: _ADJS[int(fact_rng.integers(len(_ADJS)))] for n in _NOUNS}
    home = {n: _PLACES[int(fact_rng.integers(len(_PLACES)))] for n in _NAMES}
    out, size = [], 0
    while size < n_chars:
        kind = int(rng.integers(5))
        n1, n2 = _NOUNS[int(rng.integers(len(_NOUNS)))], _NOUNS[int(rng.integers(len(_NOUNS)))]
        name = _NAMES[int(rng.integers(len(_NAMES)))]
        if kind == 0:
            s = f"the {colour[n1]} {n1} {_VERBS[int(rng.integers(len(_VERBS)))]} the {colour[n2]} {n2}."
        elif kind == 1:
            a, b = int(rng.integers(50)), int(rng.integers(50))
            s = f"{a} plus {b} is {a + b}."
        elif kind == 2:
            s = f"{name} lives near {home[name]} and has {int(rng.integers(2, 10))} {n1}s."
        elif kind == 3:
            s = f"every {n1} is {colour[n1]}, so the {n1} near {home[name]} is {colour[n1]}."
        else:
            s = f"{name} {_VERBS[int(rng.integers(len(_VERBS)))]} a {n2}, and the {n2} is {colour[n2]}."
        s += "\n" if rng.random() < 0.2 else " "
        out.append(s)
        size += len(s)
    return "".join(out)[:n_chars]


class CharTokenizer:
    """Char-level tokenizer over ALPHABET with the Hugging Face call convention (`tok(texts)["input_ids"]`)."""

    def __init__(self, alphabet: str = ALPHABET):
        self.alphabet = alphabet
        self.stoi = {c: i for i, c in enumerate(alphabet)}
        self.eos_token_id = self.stoi["\n"]

    def __len__(self) -> int:
        return len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as exc:
            raise UserError(f"character {exc.args[0]!r} is not in the embedded alphabet") from None

    def __call__(self, texts, add_special_tokens: bool = False):
        if isinstance(texts, str):
            return {"input_ids": self.encode(texts)}
        return {"input_ids": [self.encode(t) for t in texts]}


@dataclass
class TokenStream:
    """Random windows of a token tensor; (x, y) with y = x shifted by one. Shapes (B, S)."""

    train: torch.Tensor  # (N,) int64
    val: torch.Tensor  # (M,) int64
    vocab_size: int
    seq_len: int
    batch_size: int
    seed: int

    def __post_init__(self):
        for name, t in (("train", self.train), ("val", self.val)):
            if t.numel() < self.seq_len + 2:
                raise UserError(f"async_pp.data: {name} split has {t.numel()} tokens, fewer than seq_len + 2")

    def _windows(self, tokens: torch.Tensor, starts: torch.Tensor):
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]  # (B, S+1)
        w = tokens[idx]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def batch(self, step: int):
        """The training batch of `step`: a pure function of (seed, step)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, self.train.numel() - self.seq_len - 1, (self.batch_size,), generator=g)
        return self._windows(self.train, starts)

    def val_batches(self, n_batches: int):
        """Fixed, evenly spaced validation windows (the same for every run and seed)."""
        total = n_batches * self.batch_size
        starts = torch.linspace(0, self.val.numel() - self.seq_len - 2, total).long()
        return [self._windows(self.val, starts[i * self.batch_size:(i + 1) * self.batch_size])
                for i in range(n_batches)]


def embedded_stream(train_chars: int, val_chars: int, seq_len: int, batch_size: int, seed: int) -> TokenStream:
    """Train and validation text are generated with different corpus seeds (0 and 1): no shared sentences by
    construction beyond chance; the run seed only changes which windows are drawn."""
    tok = CharTokenizer()
    train = torch.tensor(tok.encode(embedded_corpus(train_chars, seed=0)), dtype=torch.long)
    val = torch.tensor(tok.encode(embedded_corpus(val_chars, seed=1)), dtype=torch.long)
    return TokenStream(train, val, len(tok), seq_len, batch_size, seed)


# ---------------------------------------------------------------------------------------------- FineWeb-Edu
FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"


def fineweb_edu_tokens(source: str, tokenizer, n_tokens: int, name: str = "sample-10BT",
                       text_key: str = "text") -> torch.Tensor:
    """Stream FineWeb-Edu (hub id, or a local folder / file of parquet shards), tokenize, append EOS after each
    document and return the first `n_tokens` tokens as a (n_tokens,) int64 tensor.

    Streaming keeps memory flat for the paper's ~20 tokens per parameter. Raises UserError if the source is empty,
    has no `text` column, or holds fewer than `n_tokens` tokens.
    """
    from datasets import load_dataset

    path = Path(source)
    if path.exists():
        files = sorted(str(p) for p in (path.glob("**/*.parquet") if path.is_dir() else [path]))
        if not files:
            raise UserError(f"async_pp.data.path: no parquet files under {path}")
        ds = load_dataset("parquet", data_files=files, split="train", streaming=True)
    elif source == FINEWEB_EDU:
        ds = load_dataset(source, name=name, split="train", streaming=True)
    else:
        raise UserError(f"async_pp.data.path: {source!r} is neither a local path nor {FINEWEB_EDU!r}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise UserError("async_pp.data.tokenizer: the tokenizer has no eos_token_id")
    ids: list[int] = []
    for row in ds:
        if text_key not in row:
            raise UserError(f"async_pp.data.path: rows of {source} have no {text_key!r} column "
                            f"(columns: {sorted(row)})")
        ids.extend(tokenizer(row[text_key], add_special_tokens=False)["input_ids"])
        ids.append(eos)
        if len(ids) >= n_tokens:
            break
    if len(ids) < n_tokens:
        raise UserError(f"async_pp.data.path: {source} holds {len(ids)} tokens, fewer than the {n_tokens} needed")
    return torch.tensor(ids[:n_tokens], dtype=torch.long)


def fineweb_stream(source: str, tokenizer, train_tokens: int, val_tokens: int, seq_len: int, batch_size: int,
                   seed: int, name: str = "sample-10BT") -> TokenStream:
    """The first `val_tokens` tokens (whole documents first in stream order) are validation, the rest training."""
    tokens = fineweb_edu_tokens(source, tokenizer, val_tokens + train_tokens, name=name)
    vocab = len(tokenizer)
    return TokenStream(tokens[val_tokens:], tokens[:val_tokens], vocab, seq_len, batch_size, seed)


def build_stream(data: DataConfig, seq_len: int, batch_size: int, seed: int) -> TokenStream:
    if data.corpus == "embedded":
        return embedded_stream(data.train_chars, data.val_chars, seq_len, batch_size, seed)
    if data.corpus == "fineweb_edu":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(data.tokenizer)
        return fineweb_stream(data.path, tok, data.train_tokens, data.val_tokens, seq_len, batch_size, seed)
    raise UserError(f"async_pp.data.corpus: {data.corpus!r} not in ['embedded', 'fineweb_edu']")
