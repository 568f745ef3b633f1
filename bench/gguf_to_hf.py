"""Dequantise a GGUF chat model into a plain Hugging Face directory (safetensors, config,
tokenizer with its chat template) that vLLM serves without its experimental GGUF plugin.

    python bench/gguf_to_hf.py MODEL.gguf OUT_DIR

Run by ``bench.gpu_check`` with the vLLM venv's interpreter (torch, transformers and gguf come
with it); it imports nothing of the project. Everything is read from the file: no network.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# SmolLM2's own format (ChatML); used only when the GGUF file carries no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def convert(gguf: Path, out: Path) -> dict[str, object]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float16)
    # transformers dequantises GGUF weights on load but still marks the model as GGUF-quantised,
    # which it refuses to save: the same weights go into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    model.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return {
        "source": str(gguf),
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
    }


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: gguf_to_hf.py MODEL.gguf OUT_DIR")
    print(json.dumps(convert(Path(sys.argv[1]), Path(sys.argv[2]))))


if __name__ == "__main__":
    main()
