"""Models: a tiny Qwen2 or Llama built from a transformers config with a character tokenizer built locally.

Why: the Hugging Face hub is unreachable here, and the study needs real transformers checkpoints so that TRL's
SFTTrainer and GRPOTrainer run unchanged (generation, chat-free prompt/completion handling, DeepSpeed wrapping).
A character tokenizer over the task alphabet keeps the vocabulary at ~20 symbols, so the model is tiny and fast.

At `paper` scale the base models are the paper's (Qwen2.5-Math-7B, Llama-3.1-8B) loaded by hub id with their own
tokenizers (`load_pretrained`); that path is real code, dry-run only on this machine.
"""

from __future__ import annotations

from pathlib import Path

from gradfidelity.errors import UserError
from gradfidelity.harness.integrity import CorruptState, verify_manifest, write_manifest
from gradfidelity.studies.sft_rl.config import ModelConfig

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
ALPHABET = "0123456789+-*=,# "
PAPER_MODELS = {  # config name -> hub id (the paper's two base models)
    "Qwen2.5-Math-7B": "Qwen/Qwen2.5-Math-7B",
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
}


def build_tokenizer():
    """A PreTrainedTokenizerFast with one token per character of ALPHABET plus pad/bos/eos (no hub)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # every character is a token
    tok.decoder = decoders.Fuse()                                             # decode without separators
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token=PAD, padding_side="left", clean_up_tokenization_spaces=False)
    return fast


def build_tiny_model(cfg: ModelConfig, tokenizer, seed: int):
    """A randomly initialised causal LM from a transformers config (deterministic in `seed`)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True, dtype="float32",
    )
    config = Qwen2Config(**common) if cfg.arch == "qwen2" else LlamaConfig(**common)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def n_params(model) -> int:
    """Parameter count used for FLOPs accounting (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def load_checkpoint(path: str | Path):
    """(model, tokenizer) from a Hugging Face checkpoint directory written by `save_checkpoint`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise UserError(f"{path}: not a Hugging Face checkpoint (no config.json)")
    try:  # the job that wrote it listed every file's size and hash: a damaged file is never loaded
        verify_manifest(path)
    except CorruptState as exc:
        raise UserError(f"{exc}. Delete {path.parent} and rerun the job that writes it") from None
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    return model, tok


WEIGHTS = "model.safetensors"


def weights_digest(path: str | Path) -> str:
    """SHA-256 of a checkpoint's weights file: what a run records as `model_sha256`, so the model beside a record
    (a committed base, an SFT start) is checked to be the one that record describes before anything trains on it."""
    from gradfidelity.harness.integrity import sha256_file

    f = Path(path) / WEIGHTS
    if not f.is_file():
        raise UserError(f"{path}: no {WEIGHTS}")
    return sha256_file(f)


def check_weights(path: str | Path, expected: str | None, record: str | Path) -> None:
    """A loud error unless the weights at `path` have the digest `record` names (`expected`; a record made before
    round 6 names none, and is trusted on its manifest alone)."""
    if expected is not None and weights_digest(path) != expected:
        raise UserError(f"{path}/{WEIGHTS}: SHA-256 {weights_digest(path)} is not the model_sha256 {expected} its "
                        f"record {record} names: these weights were not made by that run. Restore them "
                        "(git checkout for a committed base) or delete the run directory and rerun it")


def save_checkpoint(model, tokenizer, path: str | Path) -> None:
    """A normal HF checkpoint (config.json, model.safetensors, tokenizer files) plus MANIFEST.sha256 (each file's
    size and hash, checked by `load_checkpoint`), written to a temp dir first and renamed, so a killed job never
    leaves a half-written checkpoint that a later rule would trust."""
    import shutil

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_manifest(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def load_pretrained(cfg: ModelConfig):
    """Paper scale: the paper's base model and tokenizer from the hub (bf16, as the paper's runs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cfg.hub_id is None:
        raise UserError(f"sft_rl.models[{cfg.name}]: hub_id is required to load a pretrained model")
    tok = AutoTokenizer.from_pretrained(cfg.hub_id)
    model = AutoModelForCausalLM.from_pretrained(cfg.hub_id, dtype="bfloat16")
    return model, tok
