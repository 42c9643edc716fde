"""Run by test_ds_guard.py in a child process (its DeepSpeed chosen by PYTHONPATH): TRL SFTTrainer on DeepSpeed
ZeRO-2 + CPU offload, GA 4, a tiny Llama built from a config and a character tokenizer, with the guard callback.
Prints GUARD_RAISED <message> or TRAINED <steps>."""

import os
import socket
import sys

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
for k, v in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
             "LOCAL_WORLD_SIZE": "1", "DS_ACCELERATOR": "cpu"}.items():
    os.environ.setdefault(k, v)

from gradfidelity.harness.extensions import use_deepspeed_extensions_dir  # noqa: E402

use_deepspeed_extensions_dir()

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from gradfidelity.guard import DeepSpeedAuditCallback, DeepSpeedAuditError  # noqa: E402

chars = "abcdefghijklmnopqrstuvwxyz ="
vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                     max_position_embeddings=64))
data = Dataset.from_dict({"text": [f"ab = {c * 3}" for c in chars[:16]]})
ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
      "gradient_clipping": "auto", "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False},
                            "contiguous_gradients": True, "overlap_comm": False,
                            "reduce_bucket_size": 100000, "allgather_bucket_size": 100000},
      "bf16": {"enabled": False}, "fp16": {"enabled": False}}
args = SFTConfig(output_dir=sys.argv[1], per_device_train_batch_size=1, gradient_accumulation_steps=4, max_steps=2,
                 learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
                 deepspeed=ds, max_length=32, dataloader_num_workers=0)
trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                     callbacks=[DeepSpeedAuditCallback()])


def _finish(*line) -> None:
    """Print the outcome, then release the process group DeepSpeed opened before the interpreter exits: round 5 saw a
    run that had trained end in SIGABRT at exit ("terminate called without an active exception": a communication
    thread still alive during teardown), which the test would read as a failed run."""
    print(*line, flush=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.exit(0)


try:
    trainer.train()
except DeepSpeedAuditError as exc:
    _finish("GUARD_RAISED", exc, "optimizer steps:", trainer.state.global_step)
_finish("TRAINED", trainer.state.global_step)
