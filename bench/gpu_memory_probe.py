"""The trainer's peak GPU memory, measured, beside the plan's estimate (obsspec/memory.py).

    rows = probe(model, shape, lora_rank=64, lengths=[8192, 16384, 32768], deadline=time.monotonic() + 180)

One policy-loss step at a time on `model` wrapped as the trainer wraps it: a PEFT LoRA of
`train.policy_lora_*`'s settings on every linear module, TRL's fused LM head
(`trl.trainer.utils.add_fused_lm_head`, the chunked log-probabilities GRPOTrainer computes), bf16
autocast, activation checkpointing on or off as transformers' Trainer turns it on. The step is
GRPO's clipped loss of one row of `tokens` token ids, every position scored, then its backward.
The row ends in one padding token, so transformers builds the 4-D attention mask a micro-batch of
unequal rows gets (the plan's assumption; a single unpadded row would take the mask-free path).
AdamW's moments exist before the first measured step (one warm-up step), as from a run's second
step on. Peak = `torch.cuda.max_memory_allocated()` over the step; `reserved` adds what the
caching allocator holds beyond it. A step that runs out of memory is reported as "does not fit"
beside its estimate (longer rows of the same setting are then not tried), and the memory is
given back before the next. On a CPU the same steps run (tiny shapes) and nothing is measured.
"""

from __future__ import annotations

import gc
import time

from obsspec.memory import GIB, trainer_memory
from obsspec.training.config import TrainConfig
from obsspec.training.plan import TRAINER_SHARE

WARMUP_TOKENS = 256


def wrap_like_the_trainer(model, lora_rank: int):
    """`model` with the trainer's policy LoRA and TRL's fused LM head (as GRPOTrainer sets them up)."""
    from peft import get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    peft_model = get_peft_model(model, TrainConfig(policy_lora_rank=lora_rank).policy_lora())
    add_fused_lm_head(peft_model.get_base_model(), temperature=1.0, outputs=("log_probs", "entropy"))
    return peft_model


def set_checkpointing(peft_model, on: bool) -> None:
    """What transformers' Trainer does for `activation_checkpointing` (and TRL for PEFT models)."""
    base = peft_model.get_base_model()
    if on:
        base.activation_checkpointing_enable()
        peft_model.enable_input_require_grads()
    else:
        base.activation_checkpointing_disable()
        peft_model.disable_input_require_grads()


def policy_loss_step(peft_model, tokens: int, vocab: int, device) -> float:
    """Forward and backward of GRPO's clipped loss over one padded row; returns the loss."""
    import torch

    ids = torch.randint(0, vocab, (1, tokens), device=device)
    attention = torch.ones_like(ids)
    attention[:, -1] = 0
    labels = ids.masked_fill(attention == 0, -100)
    labels[:, 0] = -100
    bf16 = next(peft_model.get_base_model().parameters()).dtype == torch.bfloat16
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):  # (TRL's bf16=True)
        out = peft_model(input_ids=ids, attention_mask=attention, labels=labels, fused_lm_head=True)
    logps = out.log_probs
    mask = (labels[:, 1:] != -100).to(logps.dtype)
    ratio = torch.exp(logps - logps.detach())
    advantage = 1.0
    per_token = -torch.min(ratio * advantage, torch.clamp(ratio, 0.8, 1.28) * advantage)
    loss = (per_token * mask).sum() / mask.sum()
    loss.backward()
    return float(loss.detach())


def probe(model, shape, lora_rank: int, lengths: list[int], deadline: float, log=print,
          settings=(True, False)) -> list[dict]:
    """One row per (checkpointing, tokens): the plan's estimate and the measured peak."""
    import torch

    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    vocab = min(shape.vocab, model.config.vocab_size)
    peft_model = wrap_like_the_trainer(model, lora_rank)
    peft_model.train()
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-6)
    set_checkpointing(peft_model, True)
    policy_loss_step(peft_model, min(WARMUP_TOKENS, *lengths), vocab, device)
    optimizer.step()  # AdamW's moments now exist, as during a run
    optimizer.zero_grad(set_to_none=True)
    total_gib = torch.cuda.get_device_properties(device).total_memory / GIB if cuda else None
    rows = []
    for checkpointing in settings:
        set_checkpointing(peft_model, checkpointing)
        failed_at = None
        for tokens in lengths:
            est = trainer_memory(shape, lora_rank, rows=1, tokens=tokens)
            row = {"tokens": tokens, "checkpointing": checkpointing,
                   "estimate_gib": round(est.total(checkpointing) / GIB, 2),
                   "estimate_parts_gib": _parts(est, checkpointing),
                   "plan_fits": (est.total(checkpointing) / GIB <= TRAINER_SHARE * total_gib) if cuda else None}
            if failed_at is not None:
                rows.append({**row, "result": f"skipped: {failed_at:,} tokens did not fit"})
                continue
            if time.monotonic() > deadline:
                rows.append({**row, "result": "skipped: the part's time box is spent"})
                continue
            row.update(_measure(peft_model, tokens, vocab, device))
            if row["measured_gib"] is not None:
                row["ratio"] = round(row["measured_gib"] / row["estimate_gib"], 3)
            if cuda:  # the plan's verdict (its estimate within the trainer's share of the GPU) against the GPU's
                row["plan_agrees"] = row["plan_fits"] == (row["result"] == "fits")
            optimizer.zero_grad(set_to_none=True)
            _release(cuda)
            if row["result"] == "does not fit":
                failed_at = tokens
            rows.append(row)
            log(line(row))
    set_checkpointing(peft_model, False)
    return rows


def _measure(peft_model, tokens: int, vocab: int, device) -> dict:
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    oom = None
    try:
        loss = policy_loss_step(peft_model, tokens, vocab, device)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        # (cuBLAS reports a failed workspace allocation as a RuntimeError, not an OutOfMemoryError)
        if not isinstance(e, torch.cuda.OutOfMemoryError) and not any(
                x in str(e) for x in ("out of memory", "ALLOC_FAILED")):
            raise
        oom = str(e).split("\n")[0][:200]
    sec = round(time.perf_counter() - t0, 2)
    if oom is not None:
        return {"result": "does not fit", "error": oom, "sec": sec,
                "measured_gib": None, "reserved_gib": None, "ratio": None}
    if not cuda:
        return {"result": "ran (no CUDA: nothing measured)", "loss": loss, "sec": sec,
                "measured_gib": None, "reserved_gib": None, "ratio": None}
    torch.cuda.synchronize(device)
    return {"result": "fits", "loss": loss, "sec": sec,
            "measured_gib": round(torch.cuda.max_memory_allocated(device) / GIB, 2),
            "reserved_gib": round(torch.cuda.max_memory_reserved(device) / GIB, 2)}


def _release(cuda: bool) -> None:
    """Give the allocator's cached blocks back, so that one step's peak does not shape the next."""
    gc.collect()
    if cuda:
        import torch

        torch.cuda.empty_cache()


def _parts(est, checkpointing: bool) -> dict:
    act = est.activations_on + est.mask_on if checkpointing else est.activations_off + est.mask_off
    return {"weights": round(est.weights / GIB, 2), "train_state": round(est.train_state / GIB, 2),
            "activations": round(act / GIB, 2), "lm_head": round(est.lm_head / GIB, 2)}


def line(row: dict) -> str:
    """One row of the plan-vs-measured table."""
    head = f"  {row['tokens']:>7,}  {'on ' if row['checkpointing'] else 'off'}  plan {row['estimate_gib']:7.1f} GiB"
    if row.get("measured_gib") is not None:
        return f"{head}  measured {row['measured_gib']:7.1f} GiB  measured/plan {row['ratio']:.2f}  ({row['sec']} s)"
    return f"{head}  {row['result']}" + (f"  ({row['sec']} s)" if "sec" in row else "")
