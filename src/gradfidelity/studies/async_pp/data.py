"""Token streams for study B: an EMBEDDED synthetic corpus (smoke), a text FILE with a BPE trained at data
preparation (cpu: Debian's Python documentation), and a FineWeb-Edu loader (paper).

Why not the generated corpus beyond smoke: it is a small grammar, and its exact entropy rate (0.223 nats a char) is
reached by every optimizer within a few hundred steps, so every delay gap vanishes because all runs sit at the
floor, not because the delay is harmless (round 2's cpu run). LLM pretraining, the paper's regime, is never near its
floor: the cpu scale trains on real text, less than one epoch at the longest budget (`check_epochs`). The generated
corpus (`embedded`) stays for smoke, where only the pipes are tested.

Batches are a pure function of (seed, step): a resumed run draws the same batches without saving any data state,
and every pipeline process draws the same micro-batches as the single-process simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gradfidelity.errors import UserError
from gradfidelity.studies.async_pp.config import FINEWEB_EDU, DataConfig

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


def fineweb_edu_tokens(source: str, tokenizer, n_tokens: int, name: str = "sample-100BT",
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
                   seed: int, name: str = "sample-100BT") -> TokenStream:
    """The first `val_tokens` tokens (whole documents first in stream order) are validation, the rest training."""
    tokens = fineweb_edu_tokens(source, tokenizer, val_tokens + train_tokens, name=name)
    vocab = len(tokenizer)
    return TokenStream(tokens[val_tokens:], tokens[:val_tokens], vocab, seq_len, batch_size, seed)


# ---------------------------------------------------------------------------------------------- a text file
# The cpu scale's corpus (issue 25): real human-written text that the longest budget does not repeat, tokenized by a
# small byte-level BPE trained at data preparation on the training split only. Prepared once by the async_pp_data
# rule into <out>/{train,val}.bin (uint16 token ids), tokenizer.json and meta.json (sizes and MD5s, checked by
# `load_prepared` before any run reads them).
SPLIT_BLOCK = 1 << 16  # the text is cut into ~64 KB blocks at line ends; every k-th block is held out


def split_blocks(text: str, val_fraction: float, block: int = SPLIT_BLOCK) -> tuple[list[str], list[str]]:
    """(train blocks, val blocks): ~`block`-character pieces cut after a newline, every round(1 / val_fraction)-th
    one held out. Interleaved rather than a tail, so that the held-out text comes from the same mix of documents
    (a sorted documentation tree ends with one section: a tail would be a distribution shift)."""
    if not 0 < val_fraction < 0.5:
        raise UserError(f"async_pp.data.val_fraction: {val_fraction} is not in (0, 0.5)")
    blocks, i = [], 0
    while i < len(text):
        j = text.find("\n", i + block)
        j = len(text) if j < 0 else j + 1
        blocks.append(text[i:j])
        i = j
    k = round(1 / val_fraction)
    val = blocks[k - 1::k]
    if not val or len(blocks) - len(val) < 1:
        raise UserError(f"async_pp.data.path: {len(text)} characters make {len(blocks)} blocks of ~{block}: too "
                        f"few to hold out every {k}-th")
    return [b for n, b in enumerate(blocks) if n % k != k - 1], val


def train_bpe(blocks: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenizer, no special tokens) with `vocab_size` ids trained on `blocks`.
    Every byte is in its initial alphabet, so any text encodes without an unknown token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257 or vocab_size > 65535:
        raise UserError(f"async_pp.data.bpe_vocab: {vocab_size} is not in [257, 65535] (uint16 ids above the "
                        "256 bytes)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(blocks, trainer=trainer)
    return tok


def _ids(tok, blocks: list[str]) -> np.ndarray:
    return np.concatenate([np.asarray(e.ids, dtype=np.uint16) for e in tok.encode_batch(blocks)])


def prepare_file(path: str | Path, out: str | Path, vocab_size: int, val_fraction: float) -> dict:
    """The async_pp_data job: split the UTF-8 text file `path`, train the BPE on its training blocks, write both
    splits' ids, the tokenizer and meta.json into `out`; returns the meta."""
    from gradfidelity.harness.io import atomic_write_json, atomic_write_text

    path, out = Path(path), Path(out)
    if not path.is_file():
        raise UserError(f"async_pp.data.path: {path} is not a file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"async_pp.data.path: {path} is not UTF-8 text (byte {exc.start}): a corpus is text") from None
    train, val = split_blocks(text, val_fraction)
    tok = train_bpe(train, vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"source": str(path), "source_bytes": len(raw), "source_md5": _md5(raw), "vocab_size": tok.get_vocab_size(),
            "val_fraction": val_fraction, "split_block": SPLIT_BLOCK, "sizes": {}, "md5": {},
            "chars": {"train": sum(map(len, train)), "val": sum(map(len, val))}}
    for name, blocks in (("train", train), ("val", val)):
        ids = _ids(tok, blocks)
        tmp = out / f"{name}.bin.part"
        ids.tofile(tmp)
        tmp.replace(out / f"{name}.bin")
        meta["sizes"][name], meta["md5"][name] = int(ids.size), _md5(ids.tobytes())
    atomic_write_text(out / "tokenizer.json", tok.to_str())
    meta["chars_per_token"] = round(meta["chars"]["train"] / meta["sizes"]["train"], 4)
    atomic_write_json(out / "meta.json", meta)
    return meta


def _md5(blob: bytes) -> str:
    import hashlib

    return hashlib.md5(blob, usedforsecurity=False).hexdigest()


def load_prepared(data_dir: str | Path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(train ids, val ids, meta) of a prepared corpus, each split's size and MD5 checked against meta.json first:
    a truncated or damaged split fails here, naming it, instead of training on what is left."""
    from gradfidelity.harness.io import read_json

    data_dir = Path(data_dir)
    remedy = f"delete {data_dir} and rerun (the async_pp_data rule prepares it again)"
    meta_path = data_dir / "meta.json"
    if not meta_path.is_file():
        raise UserError(f"{meta_path} does not exist: {remedy}")
    meta = read_json(meta_path)
    splits = []
    for name in ("train", "val"):
        p = data_dir / f"{name}.bin"
        want = (meta.get("sizes") or {}).get(name), (meta.get("md5") or {}).get(name)
        if not p.is_file() or None in want:
            raise UserError(f"{p} or its size and MD5 in {meta_path} are missing: {remedy}")
        blob = p.read_bytes()
        if len(blob) != 2 * want[0] or _md5(blob) != want[1]:
            raise UserError(f"{p}: {len(blob) // 2} tokens with MD5 {_md5(blob)}, but {meta_path} records "
                            f"{want[0]} tokens with MD5 {want[1]} (damaged or truncated): {remedy}")
        ids = np.frombuffer(blob, dtype=np.uint16).astype(np.int64)
        if ids.size and int(ids.max()) >= int(meta["vocab_size"]):
            raise UserError(f"{p}: token id {int(ids.max())} >= the vocabulary {meta['vocab_size']}: {remedy}")
        splits.append(torch.from_numpy(ids))
    return splits[0], splits[1], meta


def file_stream(data_dir: str | Path, seq_len: int, batch_size: int, seed: int) -> TokenStream:
    train, val, meta = load_prepared(data_dir)
    return TokenStream(train, val, int(meta["vocab_size"]), seq_len, batch_size, seed)


def check_epochs(stream: TokenStream, steps: int, max_epochs: float, key: str = "async_pp.data.max_epochs") -> float:
    """Epochs of the training split that `steps` batches draw (random windows, so in expectation); above
    `max_epochs` (> 0) the run is refused before any step: issue 25's regime is text that no budget repeats."""
    epochs = steps * stream.batch_size * stream.seq_len / stream.train.numel()
    if max_epochs > 0 and epochs > max_epochs:
        raise UserError(f"{key}: {steps} steps of {stream.batch_size} x {stream.seq_len} tokens draw {epochs:.2f} "
                        f"epochs of the {stream.train.numel()}-token training split, above {max_epochs}")
    return epochs


def build_stream(data: DataConfig, seq_len: int, batch_size: int, seed: int,
                 data_dir: str | Path | None = None) -> TokenStream:
    """The cell's token stream; a `file` corpus reads the prepared `data_dir` (the training rule's input)."""
    if data.corpus == "embedded":
        return embedded_stream(data.train_chars, data.val_chars, seq_len, batch_size, seed)
    if data.corpus == "file":
        if data_dir is None:
            raise UserError("async_pp.data.corpus file: the run needs the prepared data folder (--data)")
        return file_stream(data_dir, seq_len, batch_size, seed)
    if data.corpus == "fineweb_edu":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(data.tokenizer)
        return fineweb_stream(data.path, tok, data.train_tokens, data.val_tokens, seq_len, batch_size, seed)
    raise UserError(f"async_pp.data.corpus: {data.corpus!r} not in ['embedded', 'file', 'fineweb_edu']")
