"""Generation engines: the `Engine` protocol and its implementations.

- `HFEngine` (obsspec.engines.hf): transformers in process, CPU or GPU, continuous batching.
- `VLLMEngine` (obsspec.engines.vllm): a client for a vLLM OpenAI-compatible server (GPU).

The implementations are imported on first use, so `import obsspec.engines` stays light (no torch).
See docs/ENGINES.md.
"""

from obsspec.engines.base import (
    Engine,
    EngineClosedError,
    FinishReason,
    Generation,
    GenerationRequest,
)

__all__ = [
    "Engine",
    "EngineClosedError",
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "HFEngine",
    "VLLMEngine",
    "load_model",
]

_LAZY = {"HFEngine": "hf", "load_model": "hf", "VLLMEngine": "vllm"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"obsspec.engines.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'obsspec.engines' has no attribute {name!r}")
