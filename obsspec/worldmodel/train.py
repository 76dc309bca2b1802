"""`train_adapter`: one LoRA adapter for the world model, trained with TRL's SFTTrainer.

    stats = train_adapter(base, tokenizer, rows, cfg, "runs/wm/.training", init_adapter=None)
    AdapterStore("runs/wm/adapters").publish("runs/wm/.training", meta=stats)

Rows are pre-tokenized `{"input_ids", "completion_mask"}` (obsspec/worldmodel/data.py, or
obsspec/models/warmstart.py `trajectory_examples` in co-training): loss on observation bodies
and their closing tags only. The training loop is the kit's (warmstart.train: CompactSFTTrainer,
cosine schedule, the Display protocol for progress), on a PEFT model around `base_model`.

The base model is lent, not given: PEFT injects LoRA layers into it in place, so afterwards the
layers are unloaded again (`PeftModel.unload`, no merge), the parameters' `requires_grad`, the
train/eval mode and the instance attributes restored. The caller can reuse the same model object for the next version
(co-training does) and serve it meanwhile only between calls.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from obsspec.worldmodel.config import WorldModelTrainConfig, peft_lora


def lora_config(cfg: WorldModelTrainConfig):
    return peft_lora(cfg.rank, cfg.alpha, cfg.target_modules)


def check_targets(base_model: Any, cfg: WorldModelTrainConfig) -> None:
    """A target module name the model does not have: one clear error before any work."""
    leaves = {name.rsplit(".", 1)[-1] for name, _ in base_model.named_modules()}
    missing = [m for m in cfg.target_modules if m not in leaves]
    if missing:
        raise ValueError(f"wm_train.target_modules: the world model has no module named "
                         f"{', '.join(missing)} (it has e.g. {', '.join(sorted(leaves - {''})[:8])})")


def train_adapter(base_model: Any, tokenizer: Any, rows: list[dict], cfg: WorldModelTrainConfig,
                  out_dir: str, init_adapter: str | None = None, display=None,
                  eval_rows: list[dict] | None = None) -> dict:
    """Train a LoRA adapter on `rows` (fresh, or continuing `init_adapter`, a PEFT adapter
    folder), save it with PEFT to `out_dir`, return stats (loss, steps, seconds, examples).

    `out_dir` is replaced as a whole: write it somewhere private and publish it with
    `AdapterStore.publish`, which is what makes a version visible.
    """
    from peft import PeftModel, get_peft_model

    from obsspec.models import warmstart

    if not rows:
        raise ValueError("no training examples (every episode was too long, had no observation, "
                         "or is held out)")
    t0 = time.monotonic()
    check_targets(base_model, cfg)
    grad_flags = {name: p.requires_grad for name, p in base_model.named_parameters()}
    was_training = base_model.training
    own_attrs = set(vars(base_model))
    embeddings = base_model.get_input_embeddings()
    own_hooks = set(embeddings._forward_hooks)
    if init_adapter:
        model = PeftModel.from_pretrained(base_model, init_adapter, is_trainable=True)
    else:
        model = get_peft_model(base_model, lora_config(cfg))
    try:
        stats = warmstart.train(model, tokenizer, rows, eval_rows or [], cfg,
                                out_dir + ".trainer", cfg.seed, "world-model adapter", display,
                                measure_train=True, micro_batch_size=cfg.micro_batch_size,
                                activation_checkpointing=cfg.activation_checkpointing)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        model.save_pretrained(out_dir)
        stats["adapter_bytes"] = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
        stats["trainable_parameters"] = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    finally:
        model.unload()  # removes the LoRA layers without merging: the base is as it was
        if cfg.activation_checkpointing:
            base_model.activation_checkpointing_disable()
        # with checkpointing the trainer (and TRL again) hooks the embeddings to make their
        # outputs require grad; the list it keeps names the last hook only
        for key in set(embeddings._forward_hooks) - own_hooks:
            del embeddings._forward_hooks[key]
        for name, p in base_model.named_parameters():
            p.requires_grad_(grad_flags.get(name, p.requires_grad))
        base_model.train(was_training)
        # PEFT/accelerate leave a bound `forward` (and such) on the instance; a deep copy of the
        # model would keep calling the original's forward, so the LoRA layers of a copy did nothing.
        for name in set(vars(base_model)) - own_attrs:
            delattr(base_model, name)
        shutil.rmtree(out_dir + ".trainer", ignore_errors=True)
    stats["init_adapter"] = init_adapter
    stats["sec"] = round(time.monotonic() - t0, 1)
    return stats
