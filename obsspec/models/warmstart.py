"""Supervised training of the tiny models with TRL's SFTTrainer, on reference trajectories.

- Policy warm start: one example per trajectory of the train split, laid out as the policy sees
  it (obsspec/tokens.py `transcript`): prompt, then per step the bash call + <|im_end|> and the
  real observation, then `done()` + <|im_end|>. Loss on the action tokens only.
- World-model base: the same token sequence with the loss on every observation body plus its
  closing tag. A causal LM predicts each body from exactly `wm_prompt_ids(history, action)`
  (everything before it), so one sequence per trajectory trains every (context -> observation)
  pair of that trajectory at once, for the cost of one forward pass instead of one per turn.

Examples are pre-tokenized rows `{"input_ids", "completion_mask"}`; with
`completion_only_loss=True`, trl 1.16's SFTTrainer turns them into labels (-100 where the mask
is 0) before training (trl/trainer/sft_trainer.py, `_prepare_dataset`).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import datasets
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback
from trl import SFTConfig, SFTTrainer

from obsspec.models.config import TinyModelConfig
from obsspec.models.tiny import no_progress_bars
from obsspec import windows
from obsspec.memory import LOGITS_CHUNK_BYTES  # one piece on the tiny models' few thousand entries
from obsspec.tokens import ChatFormat, as_view, transcript, wm_row
from obsspec.progress import Display, NullDisplay


def examples(fmt: ChatFormat, trajectories: Iterable[dict], target: str,
             max_length: int, snapshots: Mapping[str, Sequence[int]] | None = None
             ) -> tuple[list[dict], int]:
    """Pre-tokenized SFT rows (`target`: "policy" or "world_model") and how many were dropped.

    A trajectory longer than `max_length` tokens is dropped rather than cut: a cut sequence would
    teach the policy half an action, or the world model half an observation. `snapshots`
    (world model only): task_id -> the task's `tokens.WorldView` or snapshot ids (`wm_row`).
    """
    if target not in ("policy", "world_model"):
        raise ValueError(f"target must be 'policy' or 'world_model', not {target!r}")
    rows, dropped = [], 0
    for row in trajectories:
        steps = [(s["command"], s["observation"]) for s in row["steps"]]
        t = transcript(fmt, row["instruction"], steps, done=target == "policy")
        if target == "policy":
            out = {"input_ids": t.ids, "completion_mask": t.action_mask}
        else:
            out = wm_row(snapshots[row["task_id"]] if snapshots is not None else (), t.ids, t.wm_mask)
        if len(out["input_ids"]) > max_length:
            dropped += 1
        elif any(out["completion_mask"]):
            rows.append(out)
    return rows, dropped


def trajectory_examples(trajectories: Iterable[Any], max_length: int,
                        prefixes: Iterable[Sequence[int]] | None = None, cut: bool = False) -> list[dict]:
    """World-model rows from rollouts (obsspec.rollout.trajectory.Trajectory): the rollout's own
    token ids, loss on its observation bodies + closing tags (`wm_mask`; error observations of
    malformed calls carry none). Without a target: left out. Longer than `max_length`: left out,
    or with `cut` (co-training) cut into windows that keep each target whole (obsspec/windows.py).
    `prefixes`: one `tokens.WorldView` (or snapshot ids) per trajectory
    (`WorkspaceSnapshots.prefixes`), when the recipe's world model reads the workspace."""
    trajectories = list(trajectories)
    prefixes = list(prefixes) if prefixes is not None else [()] * len(trajectories)
    if len(prefixes) != len(trajectories):
        raise ValueError(f"{len(prefixes)} snapshot prefixes for {len(trajectories)} trajectories")
    rows = [wm_row(p, tr.ids, tr.wm_mask) for tr, p in zip(trajectories, prefixes)]
    if cut:
        return [w for r, p in zip(rows, prefixes) for w in windows.fit(r, max_length, len(as_view(p).prefix))[0]]
    return [r for r in rows if len(r["input_ids"]) <= max_length and any(r["completion_mask"])]


TRAIN_SAMPLE = 64  # train rows whose loss is measured after training


class CompactSFTTrainer(SFTTrainer):
    """SFTTrainer whose loss runs the LM head on the labelled positions only.

    On devices without Triton (CPUs), trl 1.16's fused LM head scores every position and computes
    entropy and top-1 statistics as well; most positions here are prompt and observation tokens
    that carry no loss, so that is most of the step's time. The loss is the same token-mean NLL.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            return super().compute_loss(model, inputs, True, num_items_in_batch)
        nll, correct, count = masked_nll(self.accelerator.unwrap_model(model), inputs)
        mode = "train" if model.training else "eval"
        self._metrics[mode]["mean_token_accuracy"].append(correct / max(count, 1))
        denominator = count if num_items_in_batch is None else num_items_in_batch
        return nll / torch.as_tensor(denominator).clamp(min=1)


def masked_nll(model: Any, batch: dict) -> tuple[torch.Tensor, int, int]:
    """(sum of next-token NLL over positions whose label is not -100, top-1 hits, count).

    The LM head scores the labelled positions only, in chunks of LOGITS_CHUNK_BYTES of fp32
    logits, each recomputed in the backward pass instead of kept: a 32k-token row of Qwen3's
    vocabulary would otherwise hold 151,936 x 4 bytes a labelled token, ~20 GB, and as much again
    for its gradient."""
    if hasattr(model, "get_base_model"):  # a PEFT model: its LoRA layers sit inside the base
        model = model.get_base_model()
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                      use_cache=False).last_hidden_state[:, :-1]
    targets = batch["labels"][:, 1:]
    mask = targets != -100
    head = model.get_output_embeddings()
    picked, wanted = hidden[mask], targets[mask]
    chunk = max(1, LOGITS_CHUNK_BYTES // (4 * head.weight.shape[0]))
    if len(wanted) <= chunk:
        nll, hits = _scored(head, picked, wanted)
        return nll, int(hits), int(mask.sum())
    nll, hits = picked.new_zeros((), dtype=torch.float32), 0
    for i in range(0, len(wanted), chunk):
        args = (head, picked[i:i + chunk], wanted[i:i + chunk])
        part, part_hits = (checkpoint(_scored, *args, use_reentrant=False) if torch.is_grad_enabled()
                           else _scored(*args))
        nll, hits = nll + part, hits + int(part_hits)
    return nll, hits, int(mask.sum())


def _scored(head, hidden: torch.Tensor, wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    return F.cross_entropy(logits, wanted, reduction="sum"), (logits.argmax(-1) == wanted).sum()


@torch.no_grad()
def heldout_loss(model: Any, rows: list[dict], pad_id: int, batch_size: int = 8) -> float | None:
    """Token-mean NLL over the masked tokens of pre-tokenized rows (exact, unlike the Trainer's
    mean of per-batch means)."""
    model.eval()
    total, count = 0.0, 0
    rows = sorted(rows, key=lambda r: len(r["input_ids"]))  # less padding
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        width = max(len(r["input_ids"]) for r in chunk)
        pad = [width - len(r["input_ids"]) for r in chunk]
        batch = {  # on the model's device
            "input_ids": torch.tensor([r["input_ids"] + [pad_id] * p for r, p in zip(chunk, pad)]),
            "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * p for r, p in zip(chunk, pad)]),
            "labels": torch.tensor([[t if m else -100 for t, m in zip(r["input_ids"], r["completion_mask"])]
                                    + [-100] * p for r, p in zip(chunk, pad)]),
        }
        nll, _, n = masked_nll(model, {k: v.to(model.device) for k, v in batch.items()})
        total, count = total + float(nll), count + n
    return total / count if count else None


class _Progress(TrainerCallback):
    """Reports training through a `Display` (one step = one optimizer step)."""

    def __init__(self, display: Display, label: str):
        self.display, self.label = display, label

    def on_train_begin(self, args, state, control, **kwargs):
        self.display.start(state.max_steps, self.label)
        if state.global_step:  # resumed from a checkpoint
            self.display.advance(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self.display.advance(1)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.display.log(f"{self.label}: step {state.global_step}/{state.max_steps} "
                             f"loss {logs['loss']:.3f}")

    def on_train_end(self, args, state, control, **kwargs):
        self.display.finish()


def planned_steps(cfg: TinyModelConfig, examples: int) -> int:
    """Optimizer steps: `epochs` passes over `examples`, capped at `max_steps` when that is set."""
    steps = math.ceil(cfg.epochs * math.ceil(examples / cfg.batch_size))
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def sft_config(cfg: TinyModelConfig, out_dir: str, seed: int, steps: int = -1, micro_batch_size: int = 0,
               **overrides: Any) -> SFTConfig:
    """Tiny-model settings: fp32, no activation checkpointing (tiny activations), no saving (unless
    overridden); the GPU when there is one, else the CPU. `micro_batch_size`: rows a pass,
    accumulated to `cfg.batch_size` (0 = all at once)."""
    micro = micro_batch_size or cfg.batch_size
    args = dict(
        output_dir=out_dir, use_cpu=not torch.cuda.is_available(), bf16=False, fp16=False,
        activation_checkpointing=False,
        max_steps=steps, num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine", warmup_steps=0.05, weight_decay=0.0,
        per_device_train_batch_size=micro, per_device_eval_batch_size=micro,
        gradient_accumulation_steps=cfg.batch_size // micro,
        # Sequences are already cut to the kit's max_length; the mask marks what is learned.
        max_length=None, completion_only_loss=True,
        # Batches of similar lengths waste less compute on padding.
        train_sampling_strategy="group_by_length",
        logging_steps=0.1, report_to="none", save_strategy="no", eval_strategy="no",
        disable_tqdm=True, seed=seed, data_seed=seed, dataloader_num_workers=0,
    )
    args.update(overrides)
    return SFTConfig(**args)


def train(model: Any, tokenizer: Any, train_rows: list[dict], eval_rows: list[dict],
          cfg: TinyModelConfig, out_dir: str, seed: int = 0, label: str = "sft",
          display: Display | None = None, measure_train: bool = True, checkpoint_steps: int = 0,
          schedule: str = "cosine", sampling: str = "group_by_length", micro_batch_size: int = 0,
          activation_checkpointing: bool = False) -> dict:
    """Train `model` in place on pre-tokenized rows; return loss figures and timings.

    Losses are token-mean NLL (nats) over the masked tokens: `eval_loss` on `eval_rows` and, with
    `measure_train`, `train_loss` on an evenly spread sample of TRAIN_SAMPLE train rows.
    `checkpoint_steps` > 0: save a checkpoint (weights, optimizer, scheduler, data position, RNG
    states) into `out_dir` about every that many steps (rounded to whole epochs), and resume from
    the latest one found there: a killed build goes on where it stopped and ends with the bytes
    an unbroken one would. The checkpoints are removed once training is done. `schedule`: the
    learning rate's after its warm-up (a transformers scheduler: `cosine`, `constant_with_warmup`);
    `sampling`: how batches are drawn (`group_by_length`: rows of similar lengths together, less
    padding; `random`). `micro_batch_size`: rows a forward/backward pass, accumulated to
    `cfg.batch_size` (0 = all at once; also the batch of the loss measurements);
    `activation_checkpointing`: recompute activations in the backward pass (long rows on GPUs).
    """
    display = display or NullDisplay()
    t0 = time.monotonic()
    steps = planned_steps(cfg, len(train_rows))
    # Checkpoints fall on epoch ends: the Trainer draws each epoch's data order when the epoch
    # begins, so only there does a resumed run draw the order an unbroken one would.
    per_epoch = math.ceil(len(train_rows) / cfg.batch_size)
    every = per_epoch * max(1, round(checkpoint_steps / per_epoch))
    saving = dict(save_strategy="steps", save_steps=every, save_total_limit=1) if checkpoint_steps else {}
    resume = _last_checkpoint(out_dir) if checkpoint_steps else None
    with _quiet():
        trainer = CompactSFTTrainer(
            model=model, args=sft_config(cfg, out_dir, seed, steps, micro_batch_size, lr_scheduler_type=schedule,
                                          train_sampling_strategy=sampling,
                                          activation_checkpointing=activation_checkpointing, **saving),
            processing_class=tokenizer,
            train_dataset=Dataset.from_list(train_rows), callbacks=[_Progress(display, label)],
        )
    trainer.remove_callback(PrinterCallback)  # progress goes through the Display instead
    if resume:
        display.log(f"{label}: resuming from {resume}")
    if steps > 0:
        with no_progress_bars():  # (checkpoint saves would draw "Writing model shards" bars)
            trainer.train(resume_from_checkpoint=resume)
    train_sec = time.monotonic() - t0
    logged = [e for e in trainer.state.log_history if "loss" in e]
    report = {
        "examples": len(train_rows), "eval_examples": len(eval_rows),
        "steps": trainer.state.global_step, "train_sec": round(train_sec, 1),
        "tokens_per_epoch": sum(len(r["input_ids"]) for r in train_rows),
        "target_tokens_per_epoch": sum(sum(r["completion_mask"]) for r in train_rows),
        # The last logging window (about the last 10% of steps), as the Trainer logged it.
        "last_logged_loss": round(logged[-1]["loss"], 4) if logged else None,
        "last_logged_token_accuracy":
            round(logged[-1].get("mean_token_accuracy", 0.0), 4) if logged else None,
    }
    pad_id = tokenizer.pad_token_id
    if measure_train:
        sample = train_rows[:: max(1, len(train_rows) // TRAIN_SAMPLE)][:TRAIN_SAMPLE]
        report["train_loss"] = _rounded(heldout_loss(model, sample, pad_id, micro_batch_size or cfg.batch_size))
    if eval_rows:
        report["eval_loss"] = _rounded(heldout_loss(model, eval_rows, pad_id, micro_batch_size or cfg.batch_size))
    report["sec"] = round(time.monotonic() - t0, 1)
    model.eval()
    _cleanup(out_dir)
    return report


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


@contextlib.contextmanager
def _quiet():
    """No tqdm bars from datasets while the trainer prepares the (small) datasets."""
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def _last_checkpoint(out_dir: str) -> str | None:
    """The Trainer's latest `checkpoint-N` folder in `out_dir` (by N), or None."""
    steps = [int(n.split("-")[1]) for n in os.listdir(out_dir) if n.startswith("checkpoint-") and
             n.split("-")[1].isdigit()] if os.path.isdir(out_dir) else []
    return os.path.join(out_dir, f"checkpoint-{max(steps)}") if steps else None


def _cleanup(out_dir: str) -> None:
    # Checkpoints (and the model card the Trainer writes beside them) are only for resuming;
    # save_strategy="no" leaves at most an empty folder.
    shutil.rmtree(out_dir, ignore_errors=True)
