"""A request's generation on the hf engine (obsspec/engines/hf.py): its state from submission to
result (`Running`) and how the model's logits become its tokens (`Decoding`: prefill, per-request
seeded sampling, stop tokens and strings, prompt-lookup proposals). Which requests run when, and
what that costs, is the engine's (scheduling) and obsspec/engines/hf_accounts.py's (accounts).

    decoding = Decoding(adapters, tokenizer, device, stats, max_positions=2048, prompt_lookup=8)
    logits, cache, t0, t1 = decoding.prefill(running)     # then decoding.accept(running, logits)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch
from transformers import DynamicCache

from obsspec.engines.base import Generation, GenerationRequest, PromptTooLong
from obsspec.engines.hf_accounts import EngineStats
from obsspec.engines.kv_batch import propose, sample_token


class Running:
    """A request from submission to result; touched by the worker thread only, except the two
    cancellation flags and `committed_since`, which the asyncio side sets."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.loop = loop
        self.future: asyncio.Future[Generation] = loop.create_future()
        self.submitted = time.perf_counter()
        self.admitted = 0.0
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.position = 0  # position id of the next input token (the last sampled one)
        self.steps = 0
        # When it became committed work: at submission for priority 0, at `promote` for a
        # speculative request; None while it is speculative. Set once, never unset.
        self.committed_since: float | None = self.submitted if request.priority == 0 else None
        self.delay = 0.0  # committed time spent waiting on low-priority forward passes
        self.generator: torch.Generator | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.abandoned = False  # the awaiting task was cancelled: drop without a result
        self.cancel_requested = False  # engine.cancel(): finish with "cancelled"

    @property
    def low(self) -> bool:
        return self.committed_since is None

    @property
    def gone(self) -> bool:
        return self.abandoned or self.cancel_requested

    def post(self, result: Generation | None = None, error: BaseException | None = None) -> None:
        resolve_soon(self.loop, self.future, result, error)


def resolve_soon(loop, future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Resolve an asyncio future from the worker thread."""

    def deliver() -> None:
        if future.done():  # cancelled meanwhile: nobody waits for this
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(deliver)
    except RuntimeError:  # the loop is closed, so nobody can be waiting
        pass


class Decoding:
    """The served model's side of generation: `adapters` (obsspec/engines/lora.py) holds the
    model, `stats` the engine's counters this updates."""

    def __init__(self, adapters, tokenizer: Any, device: torch.device, stats: EngineStats, *,
                 max_positions: int | None = None, prompt_lookup: int = 0, prefix_cache=None):
        self.adapters, self.tokenizer, self.device, self.stats = adapters, tokenizer, device, stats
        # Greedy requests feed up to this many tokens proposed from their own context per pass
        # (kv_batch.propose) and keep the ones the model agrees with; 0 = one token per pass.
        self.prompt_lookup = prompt_lookup
        # Prefills reuse the keys and values of prompt blocks an earlier prompt had
        # (obsspec/engines/prefix_cache.py); None = off.
        self.prefix_cache = prefix_cache
        self.max_positions = max_positions

    def prefill(self, r: Running) -> tuple[torch.Tensor, DynamicCache, float, float]:
        """The prompt's forward pass (alone): the last position's logits, the request's cache, and
        when the pass started and ended."""
        request = r.request
        r.admitted = time.perf_counter()
        if self.max_positions is not None and len(request.prompt_ids) > self.max_positions:
            raise PromptTooLong(
                f"prompt of {len(request.prompt_ids)} tokens exceeds the model's "
                f"{self.max_positions} positions"
            )
        if not request.greedy:
            r.generator = torch.Generator(device=self.device).manual_seed(request.seed)
        self.adapters.use(request.adapter)
        model = self.adapters.model
        t0 = time.perf_counter()
        if self.prefix_cache is not None:
            logits, cache = self.prefix_cache.prefill(model, request.prompt_ids, request.adapter, self.device)
        else:
            cache = DynamicCache(config=model.config)
            ids = torch.tensor([request.prompt_ids], device=self.device)
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        t1 = time.perf_counter()
        self.stats.prefill_sec += t1 - t0
        self.stats.prefills += 1
        self.stats.prefill_tokens += len(request.prompt_ids)
        r.position = len(request.prompt_ids)
        return logits, cache, t0, t1

    def accept(self, r: Running, logits: torch.Tensor) -> None:
        """Sample the next token of `r` and decide whether it is finished."""
        request = r.request
        token, logprob = sample_token(logits, request.temperature, request.top_p, r.generator)
        r.tokens.append(token)
        r.logprobs.append(logprob)
        self.stats.tokens += 1
        if token in request.stop_token_ids:
            r.finish_reason, r.stop_reason = "stop", token
        elif (stop_string := self.stop_string(r)) is not None:
            r.finish_reason, r.stop_reason = "stop", stop_string
        elif len(r.tokens) >= request.max_new_tokens:
            r.finish_reason = "length"
        elif self.max_positions is not None and r.position >= self.max_positions:
            r.finish_reason = "length"  # the last token has no position left to be fed at

    def proposal(self, r: Running) -> list[int]:
        """Tokens proposed for a greedy request from its own context (never for a sampled one,
        whose tokens must be drawn one by one), within its token and position budgets."""
        if not r.request.greedy:
            return []
        room = min(self.prompt_lookup, r.request.max_new_tokens - len(r.tokens) - 1)
        if self.max_positions is not None:
            room = min(room, self.max_positions - r.position - 1)
        return propose((*r.request.prompt_ids, *r.tokens), room) if room > 0 else []

    def accept_proposed(self, r: Running, logits: torch.Tensor, proposal: list[int]) -> int:
        """Greedy tokens from a verifying pass: the model's choice after each fed column, for as
        long as it equals the next proposed token. Returns how many columns were fed for real
        (the last sampled token and the accepted proposals)."""
        j = 0
        while True:
            r.position += 1
            self.accept(r, logits[j])
            if r.finish_reason is not None or j == len(proposal) or r.tokens[-1] != proposal[j]:
                break
            j += 1
        self.stats.proposed_tokens += len(proposal)
        self.stats.proposed_accepted += j
        return j + 1

    def stop_string(self, r: Running) -> str | None:
        stops = r.request.stop_strings
        if not stops:
            return None
        # A match must end in the newest token (else it would have stopped earlier) and every
        # token is at least one byte, so the last (longest stop in bytes + 4) tokens suffice;
        # the 4 spare tokens absorb a multi-byte character cut at the window's start.
        window = max(len(s.encode()) for s in stops) + 4
        text = self.tokenizer.decode(r.tokens[-window:], skip_special_tokens=False)
        return next((s for s in stops if s in text), None)
