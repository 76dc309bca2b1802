"""Predictors of a command's observation: the world model, a history cache, an oracle, none.

A predictor returns candidate observation *bodies* (text); the scheduler puts each through the
same normalisation, truncation and encoding a real observation gets before it is used or
compared, so a predictor can never smuggle in token ids that a real observation would not have.

- `WorldModelPredictor`  a world model served by an engine: one greedy draft, plus breadth-1
                         sampled ones; stops at the observation's closing tag.
- `HistoryCache`         exact observations seen before for the same task and the same committed
                         command history (GRPO group members share prefixes). Instant; still
                         verified against the real tool like any draft.
- `Siblings`             sibling futures: when another episode is running the same command on the
                         same task and history (a GRPO group issuing the same command), the first
                         real result to arrive is the draft (tool latencies vary, so the fastest
                         sibling is often well ahead).
- `Oracle`               replays recorded observations (the upper bound on hit rate).
- `WithHistory`          the tiered predictor: the history cache, then sibling futures, then
                         another predictor (the world model) for the rest; the cache's contents
                         can be saved and restored (training checkpoints).
- `NoPredictor`          never predicts (speculative mode then behaves sequentially).
Test and benchmark wrappers: `Corrupting` (spoils drafts: forced rollbacks), `Delayed` (slower
than the tool: forced exec_won).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from obsspec import chat
from obsspec.engines.base import GenerationRequest, PromptTooLong
from obsspec.env.task import Task
from obsspec.tokens import wm_context


@dataclass(frozen=True)
class PredictRequest:
    task_key: str                  # identifies the task instance (its content hash)
    task_id: str
    episode: int
    turn: int
    commands: tuple[str, ...]      # committed commands so far, the current one last
    prompt_ids: tuple[int, ...]    # what a world model sees: history + action + observation opening
    task: Task | None = field(default=None, compare=False)  # the episode's task (its workspace)
    # ask the world model (the gate's price of it: obsspec/rollout/gate.py `ask`)? The
    # model-free tiers answer either way.
    world_model: bool = field(default=True, compare=False)
    held: str = field(default="", compare=False)  # why not (the gate's reason: wm_cost, no_time)


@dataclass(frozen=True)
class Draft:
    body: str | None  # None: the generation never closed the observation (unusable, counted)
    tokens: int = 0   # world-model tokens it took (0 for instant predictors)
    # who made it: "world_model", "history" (a group member or an earlier step saw it),
    # "sibling" (a group member running the same command finished first) or "oracle"; metrics
    # keep the world model's own hit rate apart from the others'
    source: str = "world_model"
    # the world model's probability of its own draft (exp of the summed token logprobs), for
    # the gate's calibration; None for replayed observations
    confidence: float | None = None
    # the engine refused the prompt as longer than the model's positions (no draft, counted
    # apart from unusable ones: spec/wm_prompt_too_long)
    too_long: bool = False


class Predictor(Protocol):
    name: str

    async def predict(self, request: PredictRequest) -> list[Draft]: ...

    def started(self, request: PredictRequest) -> None:
        """Told when a command starts running in the tool (whether or not it is predicted)."""

    def learn(self, request: PredictRequest, body: str) -> None:
        """Told the real observation body after every executed command."""

    def watch(self, in_flight) -> None:
        """`in_flight(delta)` is told when world-model requests start (+n) and end (-n)."""


class Base:
    """What a predictor that ignores `started`, `learn` and `watch` inherits."""

    name = "base"

    def started(self, request: PredictRequest) -> None:
        pass

    def learn(self, request: PredictRequest, body: str) -> None:
        pass

    def watch(self, in_flight) -> None:
        pass


class NoPredictor(Base):
    name = "none"

    async def predict(self, request: PredictRequest) -> list[Draft]:
        return []


def history_key(commands: Sequence[str]) -> str:
    """A command history as a fixed-size key (histories grow with every turn)."""
    h = hashlib.sha256()
    for c in commands:
        h.update(c.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


class HistoryCache(Base):
    """Observations by (task, command history), least recently used first out past `max_chars`
    characters of observations: the policy decides how long and how many they are, and the
    cache lives through a whole training run and into every checkpoint."""

    name = "history"
    MAX_CHARS = 200_000_000

    def __init__(self, max_chars: int = MAX_CHARS):
        self._seen: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.max_chars, self._chars = max_chars, 0

    async def predict(self, request: PredictRequest) -> list[Draft]:
        key = (request.task_key, history_key(request.commands))
        body = self._seen.get(key)
        if body is None:
            return []
        self._seen.move_to_end(key)
        return [Draft(body, source=self.name)]

    def learn(self, request: PredictRequest, body: str) -> None:
        self._put((request.task_key, history_key(request.commands)), body)

    def _put(self, key: tuple[str, str], body: str) -> None:
        old = self._seen.pop(key, None)
        self._chars += len(body) - (len(old) if old is not None else 0)
        self._seen[key] = body
        while self._chars > self.max_chars and len(self._seen) > 1:
            self._chars -= len(self._seen.popitem(last=False)[1])

    def state(self) -> list:
        """The cache as JSON-able rows [task_key, history key, body], oldest first (checkpoints)."""
        return [[task, history, body] for (task, history), body in self._seen.items()]

    def load_state(self, rows: list) -> None:
        self._seen, self._chars = OrderedDict(), 0
        for task, history, body in rows:
            # (a checkpoint written before histories were hashed holds the command list)
            self._put((task, history if isinstance(history, str) else history_key(history)), body)


class Oracle(HistoryCache):
    """A history cache filled from recorded trajectories: (task, commands) -> observation."""

    name = "oracle"

    def __init__(self, records: Sequence[tuple[str, Sequence[str], Sequence[str]]]):
        """records: (task_key, commands, observation bodies), one entry per recorded episode."""
        super().__init__(max_chars=1 << 62)  # everything recorded
        for task_key, commands, bodies in records:
            for i, body in enumerate(bodies):
                self._put((task_key, history_key(commands[: i + 1])), body)

    def learn(self, request: PredictRequest, body: str) -> None:
        pass  # an oracle only knows what was recorded


class Siblings(Base):
    """Sibling futures: the real result of the same command on the same task and history, from
    whichever other episode running it finishes first. `predict` waits for it (until the
    episode's own tool wins and cancels the wait); it costs no compute meanwhile."""

    name = "sibling"
    MAX_OPEN = 100_000  # keys of commands still running (a failed episode never resolves its own)

    def __init__(self) -> None:
        # key -> (the first result's future, the episodes running that command)
        self._open: OrderedDict[tuple[str, str], tuple[asyncio.Future, set[int]]] = OrderedDict()

    @staticmethod
    def _key(request: PredictRequest) -> tuple[str, str]:
        return request.task_key, history_key(request.commands)

    def started(self, request: PredictRequest) -> None:
        self._entry(self._key(request))[1].add(request.episode)

    def _entry(self, key: tuple[str, str]) -> tuple[asyncio.Future, set[int]]:
        """The key's entry, opened (and the oldest dropped past MAX_OPEN) if it has none."""
        if key not in self._open:
            self._open[key] = (asyncio.get_running_loop().create_future(), set())
            while len(self._open) > self.MAX_OPEN:
                future, _ = self._open.popitem(last=False)[1]
                future.cancel()
        return self._open[key]

    def elsewhere(self, request: PredictRequest) -> bool:
        """Is another episode running this command on the same task and history now?"""
        entry = self._open.get(self._key(request))
        return entry is not None and bool(entry[1] - {request.episode})

    async def predict(self, request: PredictRequest) -> list[Draft]:
        future = self._entry(self._key(request))[0]
        try:
            # shielded: cancelling this prediction (our own tool won) leaves the future to the others
            return [Draft(await asyncio.shield(future), source=self.name)]
        except asyncio.CancelledError:
            if future.cancelled():  # dropped past MAX_OPEN, not us being cancelled
                return []
            raise

    def learn(self, request: PredictRequest, body: str) -> None:
        entry = self._open.pop(self._key(request), None)
        if entry is not None and not entry[0].done():
            entry[0].set_result(body)


class WithHistory:
    """The tiered predictor: the history cache when it has the observation, else a sibling's
    result when another episode is already running the same command, else `inner` raced
    against a sibling that starts it later."""

    def __init__(self, inner: Predictor, siblings: bool = True):
        self.inner, self.cache = inner, HistoryCache()
        self.siblings = Siblings() if siblings else None
        self.name = f"history+{inner.name}"
        self.lookups = self.hits = 0

    async def predict(self, request: PredictRequest) -> list[Draft]:
        self.lookups += 1
        drafts = await self.cache.predict(request)
        if drafts:
            self.hits += 1
            return drafts
        if self.siblings is not None and self.siblings.elsewhere(request):
            # a sibling started first: its exact result is the draft (no world-model compute)
            return await self.siblings.predict(request)
        if not request.world_model:
            return []  # (the gate priced the world model's draft out)
        if self.siblings is None:
            return await self.inner.predict(request)
        # none yet: the inner predictor's drafts and a sibling joining later race; the first
        # answer wins (a sibling's result cancels the world model's generation), no draft waits
        sibling = asyncio.ensure_future(self.siblings.predict(request))
        inner = asyncio.ensure_future(self.inner.predict(request))
        try:
            pending = {sibling, inner}
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in (sibling, inner):
                    if task in done and task.result():
                        return task.result()
            return []
        finally:
            for task in (sibling, inner):
                task.cancel()
            await asyncio.wait({sibling, inner})

    def started(self, request: PredictRequest) -> None:
        if self.siblings is not None:
            self.siblings.started(request)
        self.inner.started(request)

    def watch(self, in_flight) -> None:
        self.inner.watch(in_flight)

    def learn(self, request: PredictRequest, body: str) -> None:
        self.cache.learn(request, body)
        if self.siblings is not None:
            self.siblings.learn(request, body)
        self.inner.learn(request, body)



# The extra drafts of rollout.breadth > 1 (the first is greedy) sample at this temperature: warm
# enough to differ from the greedy draft, cool enough to stay plausible; no recipe has set another.
EXTRA_DRAFT_TEMPERATURE = 0.7


class WorldModelPredictor(Base):
    """`snapshots` (obsspec/worldmodel/views.py `WorkspaceSnapshots`, or None): read the context
    in the task's `WorldView` (its workspace snapshot ahead, its hints after each call;
    `wm_context`), as training rows have it."""

    name = "world_model"

    def __init__(self, engine, fmt, *, cap: int, max_tokens: int = 256, breadth: int = 1,
                 temperature: float = EXTRA_DRAFT_TEMPERATURE, adapter: str | None = None, seed: int = 0, snapshots=None):
        self.engine, self.fmt, self.cap = engine, fmt, cap
        self.max_tokens, self.breadth, self.temperature = max_tokens, breadth, temperature
        self.adapter, self.seed, self.snapshots = adapter, seed, snapshots
        self.in_flight = lambda delta: None

    def watch(self, in_flight) -> None:
        self.in_flight = in_flight

    async def prompt_ids(self, request: PredictRequest) -> list[int]:
        if self.snapshots is None:
            return list(request.prompt_ids)
        if request.task is None:
            raise ValueError("a world model with workspace snapshots needs each request's task")
        return wm_context(await self.snapshots.prefix(request.task), request.prompt_ids)

    async def predict(self, request: PredictRequest) -> list[Draft]:
        if not request.world_model:
            return []
        prompt = await self.prompt_ids(request)
        requests = []
        for k in range(self.breadth):
            requests.append(GenerationRequest(
                prompt, max_new_tokens=self.max_tokens,
                temperature=0.0 if k == 0 else self.temperature,
                seed=derive_seed(self.seed, "wm", request.episode, request.turn, k),
                stop_token_ids=self.fmt.wm_stop_token_ids, stop_strings=self.fmt.wm_stop_strings,
                adapter=self.adapter))
        # A task group: cancelling this coroutine cancels every engine request, and so does one
        # request failing (a plain gather would leave its siblings running, unowned).
        self.in_flight(len(requests))
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self.engine.generate(r)) for r in requests]
        except BaseExceptionGroup as eg:
            if isinstance(eg.exceptions[0], PromptTooLong):
                # The history may fill the policy's context, and the world model's prompt adds
                # the observation opening (and the snapshot and hints): no room, no draft (taken
                # for a bug of ours, this ended a training run), counted.
                return [Draft(None, too_long=True)]
            raise eg.exceptions[0] from None  # the first failure, as the scheduler expects it
        finally:
            self.in_flight(-len(requests))
        generations = [t.result() for t in tasks]
        # A generation that never closed the observation (hit max_tokens, or stopped on a bare
        # closing tag) cannot match anything: it comes back with body None, to be counted.
        return [Draft(chat.split_draft(self.fmt.decode(g.token_ids)), len(g.token_ids),
                      confidence=math.exp(sum(g.logprobs))) for g in generations]

    def learn(self, request: PredictRequest, body: str) -> None:
        # co-training happens between policy updates, not here; it needs the tasks' snapshots
        if self.snapshots is not None and request.task is not None:
            self.snapshots.remember(request.task)


class Corrupting(Base):
    """Spoils every `every`-th draft (by turn) with one extra byte: a guaranteed rollback."""

    def __init__(self, inner: Predictor, every: int = 1):
        self.inner, self.every = inner, every
        self.name = f"{inner.name}+corrupt{every}"

    async def predict(self, request: PredictRequest) -> list[Draft]:
        drafts = await self.inner.predict(request)
        if (request.turn + request.episode) % self.every == 0:
            drafts = [Draft(d.body and d.body.replace("(exit_code=", " (exit_code=", 1), d.tokens, d.source,
                            d.confidence) for d in drafts]
        return drafts

    def started(self, request: PredictRequest) -> None:
        self.inner.started(request)

    def learn(self, request: PredictRequest, body: str) -> None:
        self.inner.learn(request, body)

    def watch(self, in_flight) -> None:
        self.inner.watch(in_flight)


class Delayed(Base):
    """Adds a fixed delay before the inner predictor answers (slower than the tool: exec_won)."""

    def __init__(self, inner: Predictor, delay_s: float):
        self.inner, self.delay_s = inner, delay_s
        self.name = f"{inner.name}+delay{delay_s:g}s"

    async def predict(self, request: PredictRequest) -> list[Draft]:
        await asyncio.sleep(self.delay_s)
        return await self.inner.predict(request)

    def started(self, request: PredictRequest) -> None:
        self.inner.started(request)

    def learn(self, request: PredictRequest, body: str) -> None:
        self.inner.learn(request, body)

    def watch(self, in_flight) -> None:
        self.inner.watch(in_flight)


def derive_seed(*parts) -> int:
    """A 31-bit seed from any parts, stable across processes (no hash randomisation)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def world_model_of(predictor):
    """The predictor behind the history tiers (`WithHistory`), or `predictor` itself."""
    return predictor.inner if isinstance(predictor, WithHistory) else predictor
