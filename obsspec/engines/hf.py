"""In-process generation engine on transformers, with continuous batching over a KV cache.

One worker thread runs the model (torch releases the GIL, so the asyncio loop stays responsive);
`generate()` hands it a request and awaits a future it resolves via `call_soon_threadsafe`. Each
worker iteration applies adapter commands, drops cancelled requests, admits waiting ones (prefill
alone, sample the first token), then runs one decode step for every running request. Sampling
uses a per-request `torch.Generator`. Details and measurements: docs/ENGINES.md.

This module schedules (admission, decode passes, results); a request's generation (prefill,
sampling, stops, prompt lookup) is obsspec/engines/hf_decode.py's, and what the engine counts
and charges speculative work is obsspec/engines/hf_accounts.py's.

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
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from obsspec.engines.base import EngineClosedError, Generation, GenerationRequest, SchedulingStats
from obsspec.engines.hf_accounts import Accounts, EngineStats, PassCost
from obsspec.engines.hf_decode import Decoding, Running, resolve_soon
from obsspec.engines.kv_batch import DecodeBatch
from obsspec.engines.lora import LoraAdapters
from obsspec.engines.prefix_cache import PrefixCache


def load_model(name_or_path: str | os.PathLike[str], *, dtype: Any = "auto", device: str = "cpu"):
    """Load a causal LM from a local folder or a hub name (the same call serves both)."""
    model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype)
    return model.to(device).eval()


# --------------------------------------------------------------------------------------------
# Worker-side state (a request's own: obsspec/engines/hf_decode.py `Running`)


@dataclass
class AdapterCommand:
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
        self.accounts = Accounts()
        self.decoding = Decoding(self.adapters, tokenizer, self.device, self.stats, max_positions=self.max_positions,
                                 prompt_lookup=prompt_lookup, prefix_cache=self.prefix_cache)
        self._cond = threading.Condition()
        self._inbox: list[Running] = []  # guarded by _cond
        self._commands: list[AdapterCommand] = []  # guarded by _cond
        self._by_id: dict[str, Running] = {}  # guarded by _cond
        self._closed = False
        self._waiting: deque[Running] = deque()  # worker only, from here on
        self._batches: list[DecodeBatch] = []
        self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._thread.start()

    # ---- asyncio side ------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> Generation:
        if request.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: HFEngine(model, tokenizer)")
        running = Running(request, asyncio.get_running_loop())
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
        return self.accounts.snapshot

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
        command = AdapterCommand(kind, name, path, loop, loop.create_future())
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
            resolve_soon(command.loop, command.future, None, error)

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
        held: list[Running] = []
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

    def _start(self, r: Running) -> bool:
        """Prefill a request and sample its first token; True if it joined a decode batch."""
        try:
            logits, cache = self._prefill(r)
            self.decoding.accept(r, logits)
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

    def _prefill(self, r: Running) -> tuple[torch.Tensor, DynamicCache]:
        speculative = [r] if r.low else []  # (as it was when its pass started)
        logits, cache, t0, t1 = self.decoding.prefill(r)
        self._charge(1, speculative, t0, t1)
        return logits, cache

    def _batch_for(self, r: Running) -> DecodeBatch:
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

    def _charge(self, rows: int, speculative: list[Running], t0: float, t1: float,
                row_cost: float | None = None) -> None:
        """Account one forward pass (`Accounts.charge`) against every committed request waiting
        or running meanwhile."""
        if not speculative:
            return
        with self._cond:
            arrived = list(self._inbox)
        self.accounts.charge(rows, speculative, t0, t1,
                             (*arrived, *self._waiting, *(r for b in self._batches for r in b.rows)), row_cost)

    def _decode(self) -> None:
        for batch in self._batches:
            if not batch.rows:  # a request failed while joining a new batch
                continue
            if _speculative_only(batch) and self._committed_work():
                continue  # speculative rows wait, holding only memory, while committed work runs
            proposals = [self.decoding.proposal(r) for r in batch.rows] if self.prompt_lookup else None
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
                        self.decoding.accept(r, logits[i])
                    else:
                        fed = self.decoding.accept_proposed(r, logits[i], proposals[i])
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

    # ---- results -----------------------------------------------------------------------------

    def _forget(self, r: Running) -> None:
        steps = self.stats.steps_by_request
        steps[r.request.request_id] = r.steps  # before the pop, so decode_steps never sees a gap
        while len(steps) > 4096:
            steps.popitem(last=False)
        with self._cond:
            self._by_id.pop(r.request.request_id, None)

    def _complete(self, r: Running) -> None:
        now = time.perf_counter()
        admitted = r.admitted or now
        self.accounts.settle(r, now)
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

    def _finish_cancelled(self, r: Running) -> None:
        self.stats.cancelled += 1
        if r.abandoned:
            self.accounts.settle(r, time.perf_counter())
            self._forget(r)
        else:
            r.finish_reason, r.stop_reason = "cancelled", None
            self._complete(r)

    def _fail(self, r: Running, error: BaseException) -> None:
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
            resolve_soon(command.loop, command.future, None, error)


def _speculative_only(batch: DecodeBatch) -> bool:
    return all(r.low for r in batch.rows)


def fast_engine(model, tokenizer, **hf_options) -> HFEngine:
    """An engine on a model already in memory, in the fast batched mode (a request's tokens may
    depend on what shares its batch): for training data and evaluations, never where speculative
    and sequential runs must agree token for token. `hf_options`: `WorldModelConfig.hf_options`
    for a world model, so its drafts are decoded as in a rollout."""
    return HFEngine(model, tokenizer, batch_invariant=False, **hf_options)
