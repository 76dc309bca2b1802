"""In-process generation engine on transformers, with continuous batching over a KV cache.

One worker thread runs the model (torch releases the GIL, so the asyncio loop stays responsive);
`generate()` hands it a request and awaits a future it resolves via `call_soon_threadsafe`. Each
worker iteration applies adapter commands, drops cancelled requests, admits waiting ones (prefill
alone, sample the first token), then runs one decode step for every running request. Sampling
uses a per-request `torch.Generator`. Details and measurements: docs/ENGINES.md.

Two modes, and what speculative (priority > 0) work costs in each:
- batched: one left-padded cache per adapter (obsspec/engines/kv_batch.py); speculative rows
  *ride* in the committed rows' decode pass while there is room (`max_batch_size` rows in all),
  where a row costs the pass's marginal time, not a pass of its own. They are charged that
  marginal time (`PassCost`: a fit of the pass time against its rows, over the recent passes).
  A request's tokens may then depend, within float noise, on what shares its batch.
- batch-invariant: every request has its own forward pass, so its results never depend on the
  others; speculative work is admitted and decoded only while no committed work runs or waits,
  and holds no slot committed work could use.

    engine = HFEngine(load_model("Qwen/Qwen3-0.6B"), tokenizer)
    async with engine:
        gen = await engine.generate(GenerationRequest(prompt_ids=ids, temperature=0))
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from obsspec.engines.base import (
    EngineClosedError,
    Generation,
    GenerationRequest,
    PromptTooLong,
    SchedulingStats,
)
from obsspec.engines.kv_batch import DecodeBatch, propose, sample_token
from obsspec.engines.lora import LoraAdapters
from obsspec.engines.prefix_cache import PrefixCache


def load_model(name_or_path: str | os.PathLike[str], *, dtype: Any = "auto", device: str = "cpu"):
    """Load a causal LM from a local folder or a hub name (the same call serves both)."""
    model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype)
    return model.to(device).eval()


@dataclass
class EngineStats:
    """Counters of the worker; read them for tests and benchmarks (not thread-synchronised)."""

    prefills: int = 0
    prefill_tokens: int = 0  # prompt tokens prefilled (with a prefix cache: of those, some reused)
    prefill_sec: float = 0.0  # time in prefill forward passes (which run alone)
    decode_steps: int = 0  # decode forward passes
    decode_sec: float = 0.0  # time in decode forward passes
    largest_batch: int = 0  # most requests decoded by one forward pass
    tokens: int = 0
    proposed_tokens: int = 0  # prompt lookup: tokens proposed, and of those accepted
    proposed_accepted: int = 0
    finished: int = 0
    cancelled: int = 0
    # decode steps each recently finished request took part in (bounded, newest last)
    steps_by_request: OrderedDict[str, int] = field(default_factory=OrderedDict)


class PassCost:
    """What a row adds to a batched decode pass: the slope of pass time against rows, fitted by
    least squares over the recent passes (exponentially weighted, so it follows the cache
    lengths). Until the passes seen vary in size it knows no slope, and the linear share
    (every row costs pass / rows) stands in: an upper bound on a pass with fixed overheads."""

    def __init__(self, decay: float = 0.98):
        self.decay = decay
        self.w = self.n = self.t = self.nn = self.nt = 0.0

    def add(self, rows: int, seconds: float) -> None:
        d = self.decay
        self.w, self.n, self.t = d * self.w + 1, d * self.n + rows, d * self.t + seconds
        self.nn, self.nt = d * self.nn + rows * rows, d * self.nt + rows * seconds

    def marginal(self, rows: int, seconds: float) -> float:
        """Seconds one row adds to a pass of `rows` rows that took `seconds`."""
        linear = seconds / rows
        var = self.nn / self.w - (self.n / self.w) ** 2 if self.w else 0.0
        if var < 0.25:  # (fewer than two sizes seen, in effect)
            return linear
        slope = (self.nt / self.w - (self.n / self.w) * (self.t / self.w)) / var
        return min(linear, max(0.0, slope))


# --------------------------------------------------------------------------------------------
# Worker-side state


class _Running:
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
        _resolve_soon(self.loop, self.future, result, error)


def _resolve_soon(loop, future: asyncio.Future, result: Any, error: BaseException | None) -> None:
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


@dataclass
class _AdapterCommand:
    kind: str  # "load" or "unload"
    name: str
    path: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


# --------------------------------------------------------------------------------------------
# The engine


class HFEngine:
    """Serve a transformers causal LM to many concurrent `generate` calls.

    The engine owns `model` while it runs: it puts it in eval mode, moves it to `device`, and
    wraps it in a PEFT model on the first `load_adapter`. A model that already is a PEFT model is
    served as given (adapter=None) and cannot load further adapters by name.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        batch_invariant: bool = False,
        max_batch_size: int = 32,
        device: str = "cpu",
        prompt_lookup: int = 0,
        prefix_cache_tokens: int = 0,
        prefix_block: int = 64,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prompt_lookup < 0:
            raise ValueError(f"prompt_lookup must be >= 0, got {prompt_lookup}")
        # Greedy requests feed up to this many tokens proposed from their own context per pass
        # (kv_batch.propose) and keep the ones the model agrees with; 0 = one token per pass.
        self.prompt_lookup = prompt_lookup
        # Prefills reuse the keys and values of `prefix_block`-token prompt blocks an earlier
        # prompt had, up to this many tokens held (obsspec/engines/prefix_cache.py); 0 = off.
        self.prefix_cache = PrefixCache(prefix_block, prefix_cache_tokens) if prefix_cache_tokens else None
        self.device = torch.device(device)
        self.adapters = LoraAdapters(model.to(self.device).eval())
        self.tokenizer = tokenizer
        self.batch_invariant = batch_invariant
        self.max_batch_size = max_batch_size
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        self.stats = EngineStats()
        self.pass_cost = PassCost()  # (batched mode: what a riding speculative row costs a pass)
        # Replaced (never mutated) by the worker, so a reader always gets a consistent snapshot.
        self._scheduling = SchedulingStats()
        self._cond = threading.Condition()
        self._inbox: list[_Running] = []  # guarded by _cond
        self._commands: list[_AdapterCommand] = []  # guarded by _cond
        self._by_id: dict[str, _Running] = {}  # guarded by _cond
        self._closed = False
        self._waiting: deque[_Running] = deque()  # worker only, from here on
        self._batches: list[DecodeBatch] = []
        self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._thread.start()

    # ---- asyncio side ------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> Generation:
        if request.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: HFEngine(model, tokenizer)")
        running = _Running(request, asyncio.get_running_loop())
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            if request.request_id in self._by_id:
                raise ValueError(f"request id {request.request_id!r} is already running")
            self._by_id[request.request_id] = running
            self._inbox.append(running)
            self._cond.notify()
        try:
            return await running.future
        except asyncio.CancelledError:
            running.abandoned = True  # the worker removes it before its next step
            with self._cond:
                self._cond.notify()
            raise

    def cancel(self, request_id: str) -> bool:
        with self._cond:
            running = self._by_id.get(request_id)
            if running is None or running.gone:
                return False
            running.cancel_requested = True
            self._cond.notify()
            return True

    def promote(self, request_id: str) -> bool:
        """Serve a speculative request as committed work from now on (a speculation that
        matched): waiting, it is admitted as committed work; running, it decodes with committed
        rows from the next step. True also for a request that already is committed work."""
        with self._cond:
            running = self._by_id.get(request_id)
            if running is None or running.gone:
                return False
            if running.committed_since is None:
                running.committed_since = time.perf_counter()
            self._cond.notify()
        return True

    def scheduling_stats(self) -> SchedulingStats:
        """What speculative work has cost committed work so far (obsspec/engines/base.py).
        Written by the worker thread; a read gets one consistent snapshot."""
        return self._scheduling

    def decode_steps(self, request_id: str) -> int | None:
        """Decode steps a running or recently finished request has taken part in."""
        with self._cond:
            running = self._by_id.get(request_id)
        if running is not None:
            return running.steps
        return self.stats.steps_by_request.get(request_id)

    async def load_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """Load (or replace) a LoRA adapter version. Requests already decoding with that name
        finish on the old weights first; requests admitted afterwards use the new ones."""
        await self._command("load", name, os.fspath(path))

    async def unload_adapter(self, name: str) -> None:
        await self._command("unload", name, None)

    async def _command(self, kind: str, name: str, path: str | None) -> None:
        loop = asyncio.get_running_loop()
        command = _AdapterCommand(kind, name, path, loop, loop.create_future())
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            self._commands.append(command)
            self._cond.notify()
        await command.future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    @property
    def model(self) -> Any:
        """The model being served (a PEFT wrapper of the one given, once adapters are loaded)."""
        return self.adapters.model

    async def __aenter__(self) -> HFEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # ---- worker thread -----------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._inbox or self._commands or self._batches
                           or self._waiting):
                    self._cond.wait()
                if self._closed:
                    break
                self._waiting.extend(self._inbox)
                self._inbox.clear()
            try:
                # Adapter loading stays outside inference mode: its weights must remain ordinary
                # tensors (inference tensors cannot be trained or saved by PEFT later).
                self._run_commands()
                with torch.inference_mode():
                    self._drop_cancelled()
                    self._admit()
                    self._decode()
            except Exception as exc:  # a bug of ours: fail what is in flight, never hang it
                self._fail_running(exc)
        self._fail_everything(EngineClosedError("the engine was closed"))

    def _run_commands(self) -> None:
        with self._cond:
            commands = list(self._commands)
        for command in commands:
            in_use = any(r.request.adapter == command.name for b in self._batches for r in b.rows)
            if in_use:
                continue  # retried after every step; admission of that adapter waits meanwhile
            with self._cond:
                self._commands.remove(command)
            error: BaseException | None = None
            try:
                if command.kind == "load":
                    self.adapters.load(command.name, command.path)
                else:
                    self.adapters.unload(command.name)
            except Exception as exc:  # reported to the caller of load/unload_adapter
                error = exc
            if self.prefix_cache is not None:  # cached keys and values belong to the old weights
                self.prefix_cache.clear()
            _resolve_soon(command.loop, command.future, None, error)

    def _drop_cancelled(self) -> None:
        for running in [r for r in self._waiting if r.gone]:
            self._waiting.remove(running)
            self._finish_cancelled(running)
        for batch in self._batches:
            gone = [r.gone for r in batch.rows]  # one reading: the flags change concurrently
            if any(gone):
                for running, is_gone in zip(batch.rows, gone):
                    if is_gone:
                        self._finish_cancelled(running)
                batch.keep([i for i, is_gone in enumerate(gone) if not is_gone])
        self._batches = [b for b in self._batches if b.rows]

    def _admit(self) -> None:
        """Committed requests first, in arrival order, while fewer than `max_batch_size`
        committed rows run (speculative rows hold no slot of theirs). Speculative ones: in
        batched mode while fewer than `max_batch_size` rows run in all (they ride in the
        committed rows' passes); in batch-invariant mode only when no committed work runs or
        could start. So at most 2 x max_batch_size rows are ever held: the speculative ones
        paused, costing memory, not compute."""
        with self._cond:
            blocked = {c.name for c in self._commands}
        rows = [r for b in self._batches for r in b.rows]
        committed = sum(not r.low for r in rows)
        speculative = len(rows) - committed
        held: list[_Running] = []
        try:
            while self._waiting:
                r = self._waiting.popleft()
                if r.low or r.request.adapter in blocked or committed >= self.max_batch_size:
                    held.append(r)
                elif self._start(r):
                    committed += 1
        finally:
            self._waiting.extendleft(reversed(held))
        if self.batch_invariant:
            if committed or any(not r.low and r.request.adapter not in blocked for r in self._waiting):
                return
            room = self.max_batch_size - speculative
        else:
            room = self.max_batch_size - committed - speculative
        held = []
        try:
            while self._waiting:
                r = self._waiting.popleft()
                if (not r.low or r.request.adapter in blocked or room <= 0
                        or (self.batch_invariant and self._committed_arrived())):
                    held.append(r)
                elif self._start(r):
                    room -= 1
        finally:
            self._waiting.extendleft(reversed(held))

    def _start(self, r: _Running) -> bool:
        """Prefill a request and sample its first token; True if it joined a decode batch."""
        try:
            logits, cache = self._prefill(r)
            self._accept(r, logits)
            if r.finish_reason is not None:
                self._complete(r)
                return False
            self._batch_for(r).add(r, cache)
            return True
        except Exception as exc:  # this request's fault (or the model's): fail it alone
            self._fail(r, exc)
            return False

    def _committed_arrived(self) -> bool:
        with self._cond:
            return any(not r.low for r in self._inbox)

    def _committed_work(self) -> bool:
        """Does committed work run, wait for a slot, or arrive? Then speculative passes wait.
        (Committed requests held for an adapter swap do not count: the swap may be waiting for
        speculative rows of that adapter to finish.)"""
        if any(not r.low for b in self._batches for r in b.rows) or self._committed_arrived():
            return True
        with self._cond:
            blocked = {c.name for c in self._commands}
        return any(not r.low and r.request.adapter not in blocked for r in self._waiting)

    def _prefill(self, r: _Running) -> tuple[torch.Tensor, DynamicCache]:
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
        speculative = [r] if r.low else []
        t0 = time.perf_counter()
        if self.prefix_cache is not None:
            logits, cache = self.prefix_cache.prefill(self.model, request.prompt_ids, request.adapter,
                                                      self.device)
        else:
            cache = DynamicCache(config=self.model.config)
            ids = torch.tensor([request.prompt_ids], device=self.device)
            logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True,
                                logits_to_keep=1).logits[0, -1]
        t1 = time.perf_counter()
        self.stats.prefill_sec += t1 - t0
        self._charge(1, speculative, t0, t1)
        self.stats.prefills += 1
        self.stats.prefill_tokens += len(request.prompt_ids)
        r.position = len(request.prompt_ids)
        return logits, cache

    def _batch_for(self, r: _Running) -> DecodeBatch:
        adapter, priority = r.request.adapter, int(r.low)
        if not self.batch_invariant:  # one batch per adapter: speculative rows ride in it
            for batch in self._batches:
                if batch.adapter == adapter:
                    return batch
        batch = DecodeBatch(adapter, priority)
        self._batches.append(batch)
        self._sort_batches()
        return batch

    def _sort_batches(self) -> None:
        # Committed batches first; grouped by adapter so that consecutive forward passes rarely
        # switch adapters. (A promoted row is committed work from its next pass on: `low` reads
        # `committed_since`, which `promote` sets; its batch needs no move.)
        self._batches.sort(key=lambda b: (_speculative_only(b), b.adapter is not None, b.adapter or ""))

    def _charge(self, rows: int, speculative: list[_Running], t0: float, t1: float,
                row_cost: float | None = None) -> None:
        """Account one forward pass of `rows` rows, `speculative` of them low-priority when it
        started. Their part of the pass is speculative compute, and it delayed every committed
        request waiting or running meanwhile, one that arrived during the pass from its arrival
        (a pass in flight cannot be interrupted). Their part: all of a pass of theirs alone; in
        a pass they ride in, `row_cost` seconds each (the marginal time of a row)."""
        if not speculative:
            return
        if row_cost is None or len(speculative) == rows:
            share = len(speculative) / rows
        else:
            share = min(1.0, len(speculative) * row_cost / max(t1 - t0, 1e-9))
        with self._cond:
            arrived = list(self._inbox)
        for r in (*arrived, *self._waiting, *(r for b in self._batches for r in b.rows)):
            since = r.committed_since
            if since is not None and t1 > since and not any(r is s for s in speculative):
                r.delay += (t1 - max(t0, since)) * share
        s = self._scheduling
        self._scheduling = replace(
            s, speculative_compute_sec=s.speculative_compute_sec + (t1 - t0) * share)

    def _decode(self) -> None:
        for batch in self._batches:
            if not batch.rows:  # a request failed while joining a new batch
                continue
            if _speculative_only(batch) and self._committed_work():
                continue  # speculative rows wait, holding only memory, while committed work runs
            proposals = [self._proposal(r) for r in batch.rows] if self.prompt_lookup else None
            if proposals is not None and not any(proposals):
                proposals = None
            try:
                self.adapters.use(batch.adapter)
                speculative = [r for r in batch.rows if r.low]
                t0 = time.perf_counter()
                logits = batch.forward(self.model) if proposals is None else \
                    batch.forward_proposed(self.model, proposals)
                t1 = time.perf_counter()
                self.stats.decode_sec += t1 - t0
                row_cost = None
                if not self.batch_invariant:
                    row_cost = self.pass_cost.marginal(len(batch.rows), t1 - t0)
                    self.pass_cost.add(len(batch.rows), t1 - t0)
                self._charge(len(batch.rows), speculative, t0, t1, row_cost)
            except Exception as exc:  # the shared forward pass failed: fail all its requests
                for r in batch.rows:
                    self._fail(r, exc)
                batch.keep([])
                continue
            self.stats.decode_steps += 1
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch.rows))
            keep = []
            for i, r in enumerate(batch.rows):
                r.steps += 1
                try:
                    if proposals is None:
                        r.position += 1
                        self._accept(r, logits[i])
                    else:
                        fed = self._accept_proposed(r, logits[i], proposals[i])
                        batch.unfeed(i, logits.shape[1] - fed)
                except Exception as exc:  # e.g. its stop-string decoding: fail it alone
                    self._fail(r, exc)
                    continue
                if r.finish_reason is None:
                    keep.append(i)
                else:
                    self._complete(r)
            batch.keep(keep)
        self._batches = [b for b in self._batches if b.rows]

    def _accept(self, r: _Running, logits: torch.Tensor) -> None:
        """Sample the next token of `r` and decide whether it is finished."""
        request = r.request
        token, logprob = sample_token(logits, request.temperature, request.top_p, r.generator)
        r.tokens.append(token)
        r.logprobs.append(logprob)
        self.stats.tokens += 1
        if token in request.stop_token_ids:
            r.finish_reason, r.stop_reason = "stop", token
        elif (stop_string := self._stop_string(r)) is not None:
            r.finish_reason, r.stop_reason = "stop", stop_string
        elif len(r.tokens) >= request.max_new_tokens:
            r.finish_reason = "length"
        elif self.max_positions is not None and r.position >= self.max_positions:
            r.finish_reason = "length"  # the last token has no position left to be fed at

    def _proposal(self, r: _Running) -> list[int]:
        """Tokens proposed for a greedy request from its own context (never for a sampled one,
        whose tokens must be drawn one by one), within its token and position budgets."""
        if not r.request.greedy:
            return []
        room = min(self.prompt_lookup, r.request.max_new_tokens - len(r.tokens) - 1)
        if self.max_positions is not None:
            room = min(room, self.max_positions - r.position - 1)
        return propose((*r.request.prompt_ids, *r.tokens), room) if room > 0 else []

    def _accept_proposed(self, r: _Running, logits: torch.Tensor, proposal: list[int]) -> int:
        """Greedy tokens from a verifying pass: the model's choice after each fed column, for as
        long as it equals the next proposed token. Returns how many columns were fed for real
        (the last sampled token and the accepted proposals)."""
        j = 0
        while True:
            r.position += 1
            self._accept(r, logits[j])
            if r.finish_reason is not None or j == len(proposal) or r.tokens[-1] != proposal[j]:
                break
            j += 1
        self.stats.proposed_tokens += len(proposal)
        self.stats.proposed_accepted += j
        return j + 1

    def _stop_string(self, r: _Running) -> str | None:
        stops = r.request.stop_strings
        if not stops:
            return None
        # A match must end in the newest token (else it would have stopped earlier) and every
        # token is at least one byte, so the last (longest stop in bytes + 4) tokens suffice;
        # the 4 spare tokens absorb a multi-byte character cut at the window's start.
        window = max(len(s.encode()) for s in stops) + 4
        text = self.tokenizer.decode(r.tokens[-window:], skip_special_tokens=False)
        return next((s for s in stops if s in text), None)

    # ---- results -----------------------------------------------------------------------------

    def _forget(self, r: _Running) -> None:
        steps = self.stats.steps_by_request
        steps[r.request.request_id] = r.steps  # before the pop, so decode_steps never sees a gap
        while len(steps) > 4096:
            steps.popitem(last=False)
        with self._cond:
            self._by_id.pop(r.request.request_id, None)

    def _settle(self, r: _Running, now: float) -> None:
        """A committed request leaves: add its time and delay to the scheduling stats."""
        since = r.committed_since
        if since is None:
            return
        s = self._scheduling
        self._scheduling = replace(
            s, committed=s.committed + 1, committed_sec=s.committed_sec + (now - since),
            committed_delay_sec=s.committed_delay_sec + r.delay)

    def _complete(self, r: _Running) -> None:
        now = time.perf_counter()
        admitted = r.admitted or now
        self._settle(r, now)
        self._forget(r)
        self.stats.finished += 1
        r.post(
            Generation(
                request_id=r.request.request_id,
                token_ids=tuple(r.tokens),
                logprobs=tuple(r.logprobs),
                finish_reason=r.finish_reason,
                stop_reason=r.stop_reason,
                queue_sec=admitted - r.submitted,
                compute_sec=now - admitted,
            )
        )

    def _finish_cancelled(self, r: _Running) -> None:
        self.stats.cancelled += 1
        if r.abandoned:
            self._settle(r, time.perf_counter())
            self._forget(r)
        else:
            r.finish_reason, r.stop_reason = "cancelled", None
            self._complete(r)

    def _fail(self, r: _Running, error: BaseException) -> None:
        self._forget(r)
        r.post(error=error)

    def _fail_running(self, error: BaseException) -> None:
        for r in [*self._waiting, *(r for b in self._batches for r in b.rows)]:
            self._fail(r, error)
        self._waiting.clear()
        self._batches.clear()

    def _fail_everything(self, error: BaseException) -> None:
        with self._cond:
            self._waiting.extend(self._inbox)
            self._inbox.clear()
            commands = list(self._commands)
            self._commands.clear()
        self._fail_running(error)
        for command in commands:
            _resolve_soon(command.loop, command.future, None, error)


def _speculative_only(batch: DecodeBatch) -> bool:
    return all(r.low for r in batch.rows)


def fast_engine(model, tokenizer, **hf_options) -> HFEngine:
    """An engine on a model already in memory, in the fast batched mode (a request's tokens may
    depend on what shares its batch): for training data and evaluations, never where speculative
    and sequential runs must agree token for token. `hf_options`: `WorldModelConfig.hf_options`
    for a world model, so its drafts are decoded as in a rollout."""
    return HFEngine(model, tokenizer, batch_invariant=False, **hf_options)
