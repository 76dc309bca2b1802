"""The engine contract shared by the policy and the world model.

An engine turns a `GenerationRequest` (token ids in, sampling parameters, a seed, an optional LoRA
adapter name) into a `Generation` (token ids out, the logprob of each sampled token, why it
stopped, how long it waited and computed). Engines serve many requests at once; the rollout
scheduler awaits `generate` in one asyncio task per request and cancels speculative work with
plain `task.cancel()`, after which the engine stops computing that request at its next step.

Two implementations: `obsspec.engines.hf.HFEngine` (transformers, CPU or GPU, in process) and
`obsspec.engines.vllm.VLLMEngine` (a client for a vLLM OpenAI-compatible server). Both follow the
same conventions, so the rollout code does not know which one it talks to:

- Only `stop_token_ids` end a generation early; EOS is not implicit (pass it as a stop token).
- The token that ends a generation (stop token, or the token completing a stop string) is kept in
  `token_ids`, and it has a logprob like every other token.
- `logprobs[i]` is the log-probability of `token_ids[i]` under log_softmax(logits / temperature)
  over the full vocabulary; top-p truncation is *not* folded in. Greedy (temperature 0) reports
  log_softmax(logits). With top_p = 1 this is the distribution actually sampled from, which is
  what importance-sampling corrections in RL need.

This module imports neither torch nor any HTTP code.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "cancelled"]


class EngineClosedError(RuntimeError):
    """Raised for requests that were still pending or running when the engine was closed."""


class NotServed(RuntimeError):
    """The model or adapter a request named is not (or no longer) served: a world model's draft
    asked of an adapter version another process just unloaded is a miss, a policy's is an error."""


class PromptTooLong(ValueError):
    """The prompt (with the tokens asked for, where the server counts them) does not fit the
    model's positions: refused, nothing generated."""


# --------------------------------------------------------------------------------------------
# Requests and results


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: a prompt of token ids and how to continue it.

    `seed` makes sampling reproducible per request: the same seed, prompt, parameters and adapter
    give the same tokens no matter what else the engine runs at the time (bit-identical in the hf
    engine's batch-invariant mode; see docs/ENGINES.md for the batched mode).
    """

    prompt_ids: Sequence[int]
    max_new_tokens: int = 256
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: Sequence[int] = ()
    stop_strings: Sequence[str] = ()  # needs an engine constructed with a tokenizer
    adapter: str | None = None  # name of a LoRA adapter version loaded with `load_adapter`
    request_id: str = ""  # empty: a fresh unique id is assigned
    # 0 = committed work. Higher = speculative: served only when no priority-0 work is running or
    # waiting, so that it never takes compute from committed generations (the scheduler uses 1;
    # `Engine.promote` makes it committed work). Scheduling only: it never changes what is
    # sampled. The hf engine preempts in both of its modes; the vLLM client forwards it only when
    # constructed with priority_scheduling=True (docs/ENGINES.md, "Priority and preemption").
    priority: int = 0

    def __post_init__(self) -> None:
        # Normalise to tuples so that requests are hashable and cannot change under the engine.
        set_ = object.__setattr__
        # (map: half the cost of a generator over a long prompt, paid on every request)
        set_(self, "prompt_ids", tuple(map(int, self.prompt_ids)))
        set_(self, "stop_token_ids", tuple(map(int, self.stop_token_ids)))
        if isinstance(self.stop_strings, str):
            raise TypeError(
                "stop_strings must be a sequence of strings, e.g. ('</tool_response>',)"
            )
        set_(self, "stop_strings", tuple(self.stop_strings))
        if not self.request_id:
            set_(self, "request_id", uuid.uuid4().hex)
        if not self.prompt_ids:
            raise ValueError("prompt_ids is empty: an engine needs at least one token to continue")
        if self.priority < 0:
            raise ValueError(f"priority must be >= 0, got {self.priority}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings must not contain an empty string")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """What an engine produced for one request."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per token in token_ids; see the module docstring
    finish_reason: FinishReason
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    queue_sec: float = 0.0  # submitted -> first computed (prefill start)
    compute_sec: float = 0.0  # prefill start -> finished

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.token_ids)} tokens but {len(self.logprobs)} logprobs"
            )


@dataclass(frozen=True)
class SchedulingStats:
    """What speculative work cost committed work, cumulative since the engine started.

    Diff two snapshots to measure a stretch of work: `after - before`. Definitions (hf engine;
    an engine that cannot see inside its server reports `measured=False` and zeros):
    - `committed_sec`: over finished (or cancelled) priority-0 requests, the time from submission
      (from `promote`, for a promoted one) to finish;
    - `committed_delay_sec`: the part of that time those requests spent waiting on forward passes
      of low-priority rows (a pass in flight cannot be interrupted; a pass mixing both classes is
      charged by its low-priority share of rows);
    - `speculative_compute_sec`: forward-pass time spent on low-priority rows.
    """

    committed: int = 0  # priority-0 requests finished
    committed_sec: float = 0.0
    committed_delay_sec: float = 0.0
    speculative_compute_sec: float = 0.0
    measured: bool = True

    def __sub__(self, other: SchedulingStats) -> SchedulingStats:
        return SchedulingStats(
            committed=self.committed - other.committed,
            committed_sec=self.committed_sec - other.committed_sec,
            committed_delay_sec=self.committed_delay_sec - other.committed_delay_sec,
            speculative_compute_sec=self.speculative_compute_sec - other.speculative_compute_sec,
            measured=self.measured and other.measured,
        )

    @property
    def delay_frac(self) -> float | None:
        """The share of committed time lost to speculative work; None when there is nothing to
        divide (no committed time, or not measured)."""
        if not self.measured or self.committed_sec <= 0:
            return None
        return self.committed_delay_sec / self.committed_sec


# --------------------------------------------------------------------------------------------
# The protocol


@runtime_checkable
class Engine(Protocol):
    """A generation engine. Use as `async with engine:` or call `close()` when done."""

    async def generate(self, request: GenerationRequest) -> Generation:
        """Generate for one request. Cancelling the awaiting task stops the request's compute."""
        ...

    def cancel(self, request_id: str) -> bool:
        """Stop a running request; its `generate` returns finish_reason "cancelled" with the
        tokens made so far. Returns False if no such request is running."""
        ...

    def promote(self, request_id: str) -> bool:
        """Serve a speculative (priority > 0) request as committed work from now on. Returns
        False when there is no such request or the engine cannot re-prioritise it."""
        ...

    def scheduling_stats(self) -> SchedulingStats:
        """Cumulative cost of speculative work to committed work (see `SchedulingStats`)."""
        ...

    async def load_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """Load a PEFT LoRA adapter (a `save_pretrained` folder) under a version name, replacing
        any adapter of that name. Prefer a new name per version (vLLM requires it)."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Forget an adapter version to free its memory."""
        ...

    def close(self) -> None:
        """Stop background work; requests still running fail with `EngineClosedError`."""
        ...

    async def __aenter__(self) -> Engine: ...

    async def __aexit__(self, *exc: object) -> None: ...
