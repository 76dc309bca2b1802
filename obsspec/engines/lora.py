"""LoRA adapter versions on one in-process model: load, replace and unload them by name, and
switch which one the next forward pass computes with.

Each version is served merged: at load, every layer it targets gets its own weight
W + (alpha / r) * B @ A (computed in float32, stored in the layer's dtype), and `use` points the
layers at that version's weights, or back at the base's own tensors, which are never written:
base-model passes equal the plain model's bit for bit, and an adapter's pass costs what a base
pass costs. (PEFT's injected LoRA layers add two small matmuls per targeted layer to every
forward pass: 1.75x the decode step time of the tiny world model, measured; the merged weights
differ from PEFT's unmerged outputs by float rounding, ~1e-5 in the logits, tested.) The
adapters are PEFT's own folders; what merging cannot serve exactly (DoRA, trained biases,
modules_to_save, per-module rank or alpha patterns, embedding LoRA) is refused with a clear error.

A version is checked before the model is touched (`check_fits`: config readable, weights
readable, every LoRA matrix's shape fits the layer it targets) and loaded under a fresh internal
PEFT name; only once it has loaded does its public name point at it and the version it replaces
get deleted. A broken or mismatched adapter is refused with `AdapterLoadError` and the engine
keeps serving what it served before, under the same name.

Only the hf engine's worker thread calls these methods, always between forward passes.
"""

from __future__ import annotations

from typing import Any


class AdapterLoadError(ValueError):
    """An adapter folder that cannot be served on this model (broken, or made for another one)."""


# adapter_config.json keys that must be unset, false, empty or "none" to be served merged
_PLAIN_ONLY = ("use_dora", "bias", "modules_to_save", "rank_pattern", "alpha_pattern", "fan_in_fan_out")


def check_fits(model: Any, path: str) -> None:
    """Raise AdapterLoadError unless the adapter at `path` loads onto `model` as it is."""
    import os

    from peft import PeftConfig
    from safetensors.torch import load_file

    try:
        PeftConfig.from_pretrained(path)
        weights = load_file(os.path.join(path, "adapter_model.safetensors"))
    except Exception as e:  # missing folder or file, bad JSON, truncated safetensors, ...
        raise AdapterLoadError(f"adapter {path}: cannot be read ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''})") from None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    modules = dict(base.named_modules())
    for key, tensor in weights.items():
        for kind in (".lora_A.", ".lora_B."):
            if kind not in key:
                continue
            where = key.split(kind)[0].removeprefix("base_model.model.")
            layer = modules.get(where)
            if layer is None or not hasattr(layer, "in_features"):
                raise AdapterLoadError(f"adapter {path} does not fit this model: no linear layer {where}")
            want = (tensor.shape[0], layer.in_features) if kind == ".lora_A." \
                else (layer.out_features, tensor.shape[1])
            if tuple(tensor.shape) != want:
                raise AdapterLoadError(f"adapter {path} does not fit this model: {key} has shape "
                                       f"{tuple(tensor.shape)}, the layer needs {want}")


class LoraAdapters:
    """The adapters loaded on `model`, served merged (read `.model` for the model itself)."""

    def __init__(self, model: Any):
        self.model = model
        # A PEFT model handed in by the caller is served exactly as given (its own active
        # adapter): the engine of a policy whose trainer holds a LoRA.
        self.served_as_given = hasattr(model, "peft_config")
        self._merged: dict[str, dict[str, Any]] = {}  # public name -> layer path -> merged weight
        self._base: dict[str, Any] = {}                # layer path -> the base's own weight tensor
        self._active: object = None                     # None = base model

    @property
    def names(self) -> set[str]:
        return set(self._merged)

    def load(self, name: str, path: str) -> None:
        if self.served_as_given:
            raise ValueError(
                "this engine serves a PEFT model as given; pass its base model instead"
            )
        check_fits(self.model, path)
        try:
            merged = self._merge(path)
        except AdapterLoadError:
            raise
        except Exception as e:
            raise AdapterLoadError(f"adapter {path}: failed to load ({type(e).__name__}: {e})") from None
        self._merged[name] = merged  # replaces the version of that name, if any
        if self._active == name:
            self._active = object()  # its layers must be pointed at the new weights

    def _merge(self, path: str) -> dict[str, Any]:
        import json
        import math
        import os

        import torch
        from safetensors.torch import load_file

        with open(os.path.join(path, "adapter_config.json")) as f:
            config = json.load(f)
        for key in _PLAIN_ONLY:
            if config.get(key) and config[key] != "none":
                raise AdapterLoadError(f"adapter {path}: {key}={config[key]!r} cannot be served merged "
                                       "(the hf engine serves plain LoRA)")
        r = int(config["r"])
        scale = float(config.get("lora_alpha", r)) / (math.sqrt(r) if config.get("use_rslora") else r)
        modules = dict(self.model.named_modules())
        pairs: dict[str, dict[str, Any]] = {}
        for key, tensor in load_file(os.path.join(path, "adapter_model.safetensors")).items():
            kind = next((k for k in ("lora_A", "lora_B") if f".{k}." in key), None)
            if kind is None:
                raise AdapterLoadError(f"adapter {path}: {key} is not a LoRA A/B matrix "
                                       "(the hf engine serves plain LoRA)")
            where = key.split(f".{kind}.")[0].removeprefix("base_model.model.")
            pairs.setdefault(where, {})[kind] = tensor
        weight_ids = [id(m.weight) for m in modules.values() if isinstance(getattr(m, "weight", None), torch.Tensor)]
        merged = {}
        with torch.no_grad():
            for where, ab in pairs.items():
                if set(ab) != {"lora_A", "lora_B"}:
                    raise AdapterLoadError(f"adapter {path}: {where} has only {sorted(ab)}")
                layer = modules[where]
                if weight_ids.count(id(layer.weight)) > 1:  # e.g. an lm_head tied to the embeddings
                    raise AdapterLoadError(f"adapter {path}: {where} shares its weight with another "
                                           "layer and cannot be served merged")
                base = self._base.setdefault(where, layer.weight.data)
                delta = ab["lora_B"].to(base.device, torch.float32) @ ab["lora_A"].to(base.device, torch.float32)
                merged[where] = (base.to(torch.float32) + scale * delta).to(base.dtype)
        return merged

    def unload(self, name: str) -> None:
        if name not in self._merged:
            raise KeyError(f"no adapter named {name!r} is loaded")
        del self._merged[name]
        if self._active == name:
            self._active = object()

    def use(self, name: str | None) -> None:
        """Make the next forward pass compute with adapter `name` (None: the base model)."""
        if name is not None and name not in self._merged:
            raise KeyError(f"adapter {name!r} is not loaded; call load_adapter first")
        if name == self._active:
            return
        modules = dict(self.model.named_modules()) if self._base else {}
        weights = self._merged.get(name, {}) if name is not None else {}
        for where, base in self._base.items():
            modules[where].weight.data = weights.get(where, base)
        self._active = name
