"""Merging a LoRA into its base (obsspec/export/models.py) on the shipped tiny policy: the merged
folder loads without PEFT, computes what base + adapter computed, and keeps the base's dtype.

Run: .venv/bin/python -m pytest -q tests/test_export_models.py
"""

import os

import pytest
import torch

from obsspec.export.models import write_adapter, write_merged

BASE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "obsspec", "bases", "tiny-cpu",
                    "policy")


def lora_checkpoint(base_dir: str, out: str, dtype) -> None:
    """A trained-looking policy LoRA (B not zero) saved as PEFT saves it in a checkpoint."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    model.save_pretrained(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_merged_lora_loads_without_peft_computes_base_plus_adapter_in_the_bases_dtype(tmp_path, dtype):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = BASE
    if dtype != torch.float32:  # a bf16 base, as Qwen3's are
        base = str(tmp_path / "base")
        AutoModelForCausalLM.from_pretrained(BASE, dtype=dtype).save_pretrained(base)
        AutoTokenizer.from_pretrained(BASE).save_pretrained(base)
    lora_checkpoint(base, str(tmp_path / "ckpt"), dtype)
    info = write_merged(base, str(tmp_path / "merged"), adapter=str(tmp_path / "ckpt"))
    assert info["dtype"] == str(dtype).replace("torch.", "") and info["lora_merged"]["rank"] == 4
    assert info["chat_template"] and not any(n.startswith("adapter_") for n in os.listdir(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    assert merged.dtype == dtype and not hasattr(merged, "peft_config")
    ids = torch.tensor([AutoTokenizer.from_pretrained(str(tmp_path / "merged")).encode("ls -la\n$ find . -name")])
    with torch.no_grad():
        want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=dtype),
                                         str(tmp_path / "ckpt"))(ids).logits.float()
        got = merged(ids).logits.float()
        plain = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)(ids).logits.float()
    effect = (plain - want).abs().mean()
    assert effect > 0.05, "the adapter changed nothing: this test could not fail"
    # bf16 rounds the merged weights (and every sum), a few units in the last place of the logits
    assert (got - want).abs().mean() < (1e-6 if dtype == torch.float32 else 0.25 * effect), \
        "the merged model is not base + adapter"
    if dtype == torch.float32:
        assert (got - want).abs().max() < 1e-4
    write_adapter(str(tmp_path / "ckpt"), str(tmp_path / "alone"))
    assert sorted(os.listdir(tmp_path / "alone")) == ["adapter_config.json", "adapter_model.safetensors"]
