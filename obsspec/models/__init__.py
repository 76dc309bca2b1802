"""The tiny local model kit: a tokenizer, a policy and a world-model base built on this machine.

No model can be downloaded here (DESIGN.md section 6), so the embedded default trains its own:

- `tokenizer.py`   byte-level BPE trained on the task corpus, shared by policy and world model
- `tiny.py`        tiny Qwen3 models from config; `load_pretrained` takes a hub name or a folder
- `warmstart.py`   supervised warm start (TRL SFTTrainer) of the policy on reference solutions and
                   pre-training of the world-model base on real observations
- `kit.py`         `ensure_kit`: build all three once, cache them keyed by config + corpus
- `evaluate.py`    `evaluate_val`: the policies' success and a world model's exact hits on the
                   validation tasks, in real sandboxes
- `config.py`      `KitConfig`, the recipe section (no torch import)

    python -m obsspec.models.kit TASKS_DIR [kit.key=value ...]                    # build (or reuse)
    python bench/evaluate_models.py TASKS_DIR [kit.key=value ...] --world-model kit

See docs/MODELS.md for the layout, the training recipe and measured numbers.

This package's `__init__` imports nothing heavy, so `obsspec.config` can import `KitConfig`.
"""

from obsspec.models.config import KitConfig, TinyModelConfig

__all__ = ["KitConfig", "TinyModelConfig"]
