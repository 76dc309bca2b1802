"""LoRA adapter versions on one in-process model: load, replace and unload them by name, and
switch which one the next forward pass computes with.

The first `load` wraps the plain model in a `peft.PeftModel` (PEFT injects the LoRA layers into
the model in place); later versions are added with `PeftModel.load_adapter`. Base-model passes
disable the adapter layers instead of unwrapping, which leaves the base weights untouched: the
outputs equal the unwrapped model's bit for bit (checked in tests/test_engines.py).

Only the hf engine's worker thread calls these methods, always between forward passes.
"""

from __future__ import annotations

from typing import Any


class LoraAdapters:
    """The adapters loaded on `model` (read `.model` after `load`: it may have been wrapped)."""

    def __init__(self, model: Any):
        self.model = model
        # A PEFT model handed in by the caller is served exactly as given (its own active
        # adapter); switching adapters on it would also flip its trainable flags.
        self.served_as_given = hasattr(model, "peft_config")
        self.names: set[str] = set()
        self._active: object = None  # None = base model

    def load(self, name: str, path: str) -> None:
        from peft import PeftModel

        if self.served_as_given:
            raise ValueError(
                "this engine serves a PEFT model as given; pass its base model instead"
            )
        if not isinstance(self.model, PeftModel):
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name).eval()
        else:
            if name in self.names:
                self.model.delete_adapter(name)
                self.names.discard(name)
            self.model.load_adapter(path, adapter_name=name)
        self.names.add(name)
        self._active = object()  # PEFT changed the active adapter: set it before the next pass

    def unload(self, name: str) -> None:
        if name not in self.names:
            raise KeyError(f"no adapter named {name!r} is loaded")
        self.model.delete_adapter(name)
        self.names.discard(name)
        self._active = object()

    def use(self, name: str | None) -> None:
        """Make the next forward pass compute with adapter `name` (None: the base model)."""
        if name is not None and name not in self.names:
            raise KeyError(f"adapter {name!r} is not loaded; call load_adapter first")
        if name == self._active:
            return
        if not self.names:  # a plain model, or every adapter unloaded: only the base exists
            self._active = name
            return
        if name is None:
            self.model.base_model.disable_adapter_layers()
        else:
            self.model.base_model.enable_adapter_layers()
            # inference_mode=True keeps the adapter's weights frozen (requires_grad=False).
            self.model.set_adapter(name, inference_mode=True)
        self._active = name
