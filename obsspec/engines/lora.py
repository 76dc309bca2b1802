"""LoRA adapter versions on one in-process model: load, replace and unload them by name, and
switch which one the next forward pass computes with.

The first `load` wraps the plain model in a `peft.PeftModel` (PEFT injects the LoRA layers into
the model in place); later versions are added with `PeftModel.load_adapter`. Base-model passes
disable the adapter layers instead of unwrapping, which leaves the base weights untouched: the
outputs equal the unwrapped model's bit for bit (checked in tests/test_engines.py).

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
    """The adapters loaded on `model` (read `.model` after `load`: it may have been wrapped)."""

    def __init__(self, model: Any):
        self.model = model
        # A PEFT model handed in by the caller is served exactly as given (its own active
        # adapter); switching adapters on it would also flip its trainable flags.
        self.served_as_given = hasattr(model, "peft_config")
        self._internal: dict[str, str] = {}  # public name -> PEFT adapter name
        self._loads = 0
        self._active: object = None  # None = base model

    @property
    def names(self) -> set[str]:
        return set(self._internal)

    def load(self, name: str, path: str) -> None:
        from peft import PeftModel

        if self.served_as_given:
            raise ValueError(
                "this engine serves a PEFT model as given; pass its base model instead"
            )
        check_fits(self.model, path)
        self._loads += 1
        internal = f"{name}__{self._loads}"
        try:
            if not isinstance(self.model, PeftModel):
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=internal).eval()
            else:
                self.model.load_adapter(path, adapter_name=internal)
        except Exception as e:
            if isinstance(self.model, PeftModel) and internal in self.model.peft_config:
                self._delete(internal)
            self._active = object()
            raise AdapterLoadError(f"adapter {path}: failed to load ({type(e).__name__}: {e})") from None
        old = self._internal.get(name)
        self._internal[name] = internal
        if old is not None:
            self._delete(old)
        self._active = object()  # PEFT changed the active adapter: set it before the next pass

    def unload(self, name: str) -> None:
        if name not in self._internal:
            raise KeyError(f"no adapter named {name!r} is loaded")
        self._delete(self._internal.pop(name))
        self._active = object()

    def _delete(self, internal: str) -> None:
        import warnings

        with warnings.catch_warnings():  # PEFT warns when the active adapter goes; `use` sets the next
            warnings.filterwarnings("ignore", message=".*was active which is now deleted.*")
            self.model.delete_adapter(internal)

    def use(self, name: str | None) -> None:
        """Make the next forward pass compute with adapter `name` (None: the base model)."""
        if name is not None and name not in self._internal:
            raise KeyError(f"adapter {name!r} is not loaded; call load_adapter first")
        if name == self._active:
            return
        if not self._internal:  # a plain model, or every adapter unloaded: only the base exists
            self._active = name
            return
        if name is None:
            self.model.base_model.disable_adapter_layers()
        else:
            self.model.base_model.enable_adapter_layers()
            # inference_mode=True keeps the adapter's weights frozen (requires_grad=False).
            self.model.set_adapter(self._internal[name], inference_mode=True)
        self._active = name
