"""Named starting points for `obsspec simulate --preset NAME`: override lists on `SimConfig`.

The GPU presets' speeds are ASSUMPTIONS taken from public vLLM figures (decode on one H100-class
GPU, bf16 unless said), not measurements of ours; docs/REPORT.md says where they come from. Their
batch follows the GPU recipes' plan (recipes/terminal-*.yaml, obsspec/training/plan.py): the
published 16 tasks x 16 rollouts = 256 episodes a step go to the policy's vLLM server on 4 GPUs of
the node (tensor parallel), seen here per GPU: 64 episodes of 16 turns of ~200 tokens, of which
at most as many generate at once as that GPU's share of the server's KV cache holds sequences of
the recipes' 32,768-token context (`policy_capacity`: 14 for Qwen3-8B on 80 GB, 13 for Qwen3-32B
on 141 GB).
"""

from __future__ import annotations

from obsspec.sim.config import SimConfig, SimError, apply_overrides
from obsspec.memory import QWEN3, server_memory

# The GPU recipes' layout (recipes/terminal-8b.yaml `servers`): the policy server's GPUs, their
# share, the context and policy LoRA rank it serves, and the episodes of a step.
POLICY_GPUS, SHARE, CONTEXT, LORA_RANK, STEP_EPISODES = 4, 0.9, 32768, 64, 256


def policy_capacity(model: str, gpu_gib: float) -> int:
    """Sequences of CONTEXT tokens one GPU's share of the policy server's KV cache holds."""
    return server_memory(QWEN3[model], POLICY_GPUS, SHARE, gpu_gib, CONTEXT, LORA_RANK).sequences // POLICY_GPUS


_BATCH = [f"workload.episodes={STEP_EPISODES // POLICY_GPUS}", "workload.concurrency=0", "workload.turns=16",
          "workload.action_tokens=200", "workload.action_spread=0.5"]
# Qwen3-0.6B world model on its own GPU share: ~300 tok/s per stream, ~120-token observations.
_WM = ["world_model.overhead_s=0.05", "world_model.tok_s=300", "world_model.obs_tokens=120"]

PRESETS: dict[str, tuple[str, list[str]]] = {
    "h100-8b": ("8B policy (Qwen3-8B class) on one H100 (80 GB), vLLM, bf16: ~130 tok/s single stream, "
                "~5,000 tok/s aggregate, as many at once as its KV cache holds 32k-token sequences; "
                "committed requests admitted first, speculative ones share the batch once admitted "
                "(the recipes' --scheduling-policy priority)",
                ["engine.single_tok_s=130", "engine.peak_tok_s=5000",
                 f"engine.max_batch={policy_capacity('Qwen/Qwen3-8B', 80)}",
                 "engine.spec_priority=priority", *_BATCH, *_WM]),
    "h100-32b": ("32B policy (Qwen3-32B class) on one H100-class GPU, bf16 on an H200 (141 GB; the "
                 "recipe's trainer does not fit 80 GB): ~45 tok/s single stream, ~1,500 tok/s aggregate",
                 ["engine.single_tok_s=45", "engine.peak_tok_s=1500",
                  f"engine.max_batch={policy_capacity('Qwen/Qwen3-32B', 141)}",
                  "engine.spec_priority=priority", *_BATCH, *_WM]),
    "cpu-tiny": ("the tiny kit on 2 CPU cores as bench/rollout_speedup.py runs it: hf engine in "
                 "batch-invariant mode (processor sharing, ~200 tok/s decode, each prompt prefilled "
                 "alone at ~70x that), low-priority speculation, 32 episodes, 4 at once, 4 turns of "
                 "~23 tokens on ~340-token prompts growing by ~90-token observations, 1 s emulated tools",
                 ["engine.single_tok_s=200", "engine.peak_tok_s=200", "engine.max_batch=32",
                  "engine.spec_priority=low", "engine.prefill_tok_s=14000", "workload.episodes=32",
                  "workload.concurrency=4", "workload.turns=4", "workload.done_frac=0.65",
                  "workload.action_tokens=23", "workload.action_spread=0.48", "workload.prompt_tokens=340",
                  "tool.median_s=1", "tool.overhead_s=0.05", "world_model.overhead_s=0.001",
                  "world_model.obs_tokens=90", "world_model.tok_s=1e9", "spec.hit_rate=1"]),
}


def preset(name: str, base: SimConfig | None = None) -> SimConfig:
    if name not in PRESETS:
        raise SimError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return apply_overrides(base or SimConfig(), PRESETS[name][1])
