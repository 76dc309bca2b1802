"""Model folders that load as they are: a LoRA merged into its base, in the base's dtype.

    info = write_merged(base, dest, adapter=checkpoint)    # PEFT LoRA merged, base dtype
    info = write_merged(checkpoint, dest)                  # full fine-tuning: the weights as trained
    write_adapter(checkpoint, dest)                        # the adapter alone (PEFT folder)

A merged folder is what `AutoModelForCausalLM.from_pretrained`, `vllm serve` and obsspec's
`policy.model` / `world_model.model` load: config.json, model.safetensors, generation_config.json
and the tokenizer with its chat template (tokenizer.json, tokenizer_config.json,
chat_template.jinja). The merge is PEFT's `merge_and_unload`: W + scale * B @ A per LoRA layer,
computed in float32 on CPU and stored in the base's dtype (a bf16 base stays bf16), so the
folder is the base's size and needs no PEFT to load.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def is_adapter(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "adapter_config.json"))


def base_dtype(base: str):
    """The dtype a base's config declares (None when its config cannot be read)."""
    import torch
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(base)
    except (OSError, ValueError):
        return None
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def write_merged(weights: str, dest: str, adapter: str | None = None, device: str = "cpu",
                 dtype_of: str | None = None) -> dict:
    """`weights` (a model folder or hub name), with `adapter` merged in when given, saved to
    `dest` in the dtype of `dtype_of` (default: `weights`' own), with the tokenizer of `adapter`
    (a trainer checkpoint carries it) or else of `weights`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from obsspec.models.tiny import no_progress_bars

    # transformers 5.23 warns that PEFT still asks is_gradient_checkpointing
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    t0 = time.monotonic()
    dtype = base_dtype(dtype_of or weights)
    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=dtype or "auto").to(device)
        lora = None
        if adapter is not None:
            from peft import PeftConfig, PeftModel

            config = PeftConfig.from_pretrained(adapter)
            lora = {"rank": config.r, "alpha": config.lora_alpha, "targets": sorted(config.target_modules)}
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        if dtype is not None and model.dtype != dtype:
            model = model.to(dtype)
        tokenizer_from = adapter if adapter and _has_tokenizer(adapter) else weights
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
        os.makedirs(dest, exist_ok=True)
        model.save_pretrained(dest)
        tokenizer.save_pretrained(dest)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"dtype": str(dtype or "").replace("torch.", "") or _saved_dtype(dest), "parameters": parameters,
            "lora_merged": lora, "chat_template": os.path.exists(os.path.join(dest, "chat_template.jinja"))
            or "chat_template" in (_read(os.path.join(dest, "tokenizer_config.json"))),
            "bytes": folder_bytes(dest), "seconds": round(time.monotonic() - t0, 2)}


def write_adapter(adapter: str, dest: str) -> dict:
    """The PEFT adapter alone (its config names the base it applies to)."""
    os.makedirs(dest, exist_ok=True)
    for name in ADAPTER_FILES:
        shutil.copy2(os.path.join(adapter, name), os.path.join(dest, name))
    return {"bytes": folder_bytes(dest)}


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def _has_tokenizer(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES)


def _saved_dtype(dest: str) -> str:
    import json

    with open(os.path.join(dest, "config.json")) as f:
        config = json.load(f)
    return str(config.get("dtype") or config.get("torch_dtype") or "")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
