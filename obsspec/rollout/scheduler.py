"""The rollout scheduler: episodes run sequentially or with observation speculation.

Both modes share one episode loop (docs/ROLLOUT.md). Per turn: the policy generates an action
from the committed token history with a seed derived from (episode, turn); a `bash` call runs in
the tool. In speculative mode, a predictor is asked for the observation at the same time; if its
draft arrives before the tool finishes, each distinct draft is encoded exactly as a real
observation would be and the policy's next action is generated on it, speculatively. When the
tool finishes, the real observation's body token ids are compared with each draft's:
- equal    -> `match`: that speculative generation becomes the next action (awaited if still
              running); it draws the same seed on the same tokens, so nothing changes but time;
- no match -> `rollback`: all speculative work is cancelled; the next action is generated on the
              real observation, as sequentially;
- the tool was first -> `exec_won`: the predictor is cancelled.
Speculative actions are never executed: only committed actions reach the tool. Every speculative
request ends in a `request_end` event: committed, cancelled (with a reason) or failed.

Load and gain: speculation only pays for itself in compute the committed work leaves idle. With
`busy_limit` N > 0, a command is not speculated on (`spec_skipped`, reason `busy`) while N or
more committed policy generations are in flight: a saturated engine would run the speculative
action only after the tool anyway, and the world model's drafts would take compute from
committed work when the two share a device. The gate (obsspec/rollout/gate.py) prices
speculation with what it costs here, measured from every committed generation
(obsspec/rollout/cost.py: the requests of each kind in flight beside it): the world model is
asked for a draft only when that is expected to pay (else only the model-free tiers answer),
and each draft's speculative action starts only when its expected gain is positive (`gate`
events carry every decision; a skipped draft is still compared with the real observation, so
the hit-rate estimates keep learning). Skipping changes timing only, never tokens.

Breadth k = the predictor's number of drafts. Depth d: a speculative action that is a `bash`
call is itself given a draft observation and a speculative next action, up to d turns ahead of
the committed history; a match at turn t carries the speculation made for turn t+1 forward, and
it is verified against turn t+1's real observation in the same way. A rollback drops everything
built on the rejected draft.

Failures and cancellation (structured: every task an episode starts belongs to its scope and
is finished — committed, cancelled with a reason, or failed — before the episode returns;
obsspec/rollout/scope.py):
- declared infrastructure failures (`INFRA_ERRORS`: the sandbox died or timed out on us, the
  engine closed, a replay diverged) end the episode with `infra_error` and reward None;
- any other exception is a bug of ours: the episode cleans up and re-raises it, traceback kept;
- an outer cancellation (Ctrl-C, a timeout around a training step) propagates, after the same
  cleanup, which a second cancellation cannot cut short (the sandbox is always closed).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from obsspec import chat
from obsspec.commands import program_class
from obsspec.engines.base import EngineClosedError, Generation, GenerationRequest, NotServed
from obsspec.env.sandbox import SandboxError
from obsspec.env.task import Task
from obsspec.rollout.cost import LoadMeter
from obsspec.rollout.events import EventBus
from obsspec.rollout.gate import Decision, Gate
from obsspec.rollout.predictors import Draft, Predictor, PredictRequest, derive_seed
from obsspec.rollout.scope import EpisodeScope, run_to_the_end
from obsspec.rollout.tools import ReplayDiverged, Tool
from obsspec.rollout.trajectory import Trajectory, Turn

@dataclass(frozen=True)
class Sampling:
    """How the scheduler samples the policy. Made from the recipe's policy section by
    `rollout.config.sampling()`; the budgets have no defaults here, so that no second set of
    them can disagree with the recipe's (temperature and top_p default as the recipe's do)."""

    max_turns: int
    max_new_tokens: int
    max_context: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


# The failures that are not the agent's and not ours to fix in code: the episode is excluded.
INFRA_ERRORS: tuple[type[BaseException], ...] = (SandboxError, EngineClosedError, ReplayDiverged)


@dataclass(eq=False)
class _Speculation:
    """One draft observation for turn `turn - 1` and the speculative action of `turn` on it."""

    draft: Draft
    body_ids: list[int]                 # the draft's observation body, encoded as a real one
    episode: int
    turn: int                           # the turn of the speculative action
    decision: Decision | None = None    # the gate's, for its calibration once the tool is done
    request_id: str = ""                # "" when no action is generated (last turn, no budget, gated)
    task: asyncio.Task | None = None    # -> Generation
    deeper: asyncio.Task | None = None  # -> list[_Speculation] for the next turn (depth > 1)
    scope: EpisodeScope | None = None   # the episode that owns it
    matched_at: float | None = None     # when its draft matched the real output (the tool's end)


class Scheduler:
    def __init__(self, policy, fmt, bus: EventBus, sampling: Sampling, cap: int,
                 predictor: Predictor | None = None, depth: int = 1, adapter: str | None = None,
                 busy_limit: int = 0, gate: Gate | None = None):
        if depth < 1 or busy_limit < 0:
            raise ValueError("speculation depth must be >= 1 and busy_limit >= 0")
        self.policy, self.fmt, self.bus, self.sampling = policy, fmt, bus, sampling
        self.cap, self.predictor, self.depth = cap, predictor, depth
        self.adapter = adapter  # the policy's LoRA version on its engine (None: the model as served)
        self.busy_limit = busy_limit  # 0: always speculate
        self.busy = 0  # committed policy generations in flight, over all episodes
        self.gate = gate or Gate(enabled=False)  # (disabled, it still keeps the estimates)
        self.meter = LoadMeter(bus.now())  # requests in flight by kind: the gate's cost samples
        self._stats = policy.scheduling_stats()  # the engine's own account, as last told to the gate
        self._spec_started = 0                   # speculative generations started since then
        if predictor is not None and hasattr(predictor, "watch"):
            predictor.watch(lambda delta: self.meter.add("world_model", delta, self.bus.now()))
        self._wm_ids = itertools.count()

    # -- one episode ------------------------------------------------------------------------------
    async def run_episode(self, task: Task, episode: int, tool: Tool, speculative: bool) -> Trajectory:
        fmt = self.fmt
        # the task's own turn limit (Task.max_turns) binds when it is the tighter one
        scope = EpisodeScope(max_turns=min(self.sampling.max_turns, task.max_turns))
        traj = Trajectory.start(episode, task.task_id, fmt.prompt_ids(task.instruction))
        task_key = task.content_hash()
        commands: list[str] = []
        pending: _Speculation | None = None  # the committed speculative generation for this turn
        carried: asyncio.Task | None = None  # speculation already made for this turn (depth > 1)
        self.bus.emit("episode_start", episode, 0, task_id=task.task_id, speculative=speculative)
        how = "episode_end"
        try:
            await tool.start()
            t0 = self.bus.now()
            for turn in range(scope.max_turns):
                if pending is not None:
                    gen, carried, pending = await self._collect(pending), pending.deeper, None
                else:
                    if self._budget(len(traj.ids)) <= 0:
                        break  # context full: the episode ends here in both modes
                    gen = await self._generate(traj.ids, episode, turn, speculative=False)
                traj.append_action(gen.token_ids, gen.logprobs)
                text = fmt.decode(gen.token_ids)
                action = fmt.parse(text)
                self.bus.emit("action", episode, turn, parsed=action.kind, form=action.form)
                if action.kind != "bash" and carried is not None:
                    await self._drop(carried, "not_a_command")  # (it found no command either)
                    carried = None
                if action.kind == "done":
                    traj.turns.append(Turn(text, "done"))
                    break
                if action.kind == "error":
                    ids, body = fmt.error_observation_ids(action.error)
                    traj.append_observation(ids, body, len(fmt.obs_close_ids), target=False)
                    traj.turns.append(Turn(text, "error", observation=chat.error_observation(action.error)))
                    continue
                commands.append(action.command)
                eligible = speculative and self.predictor is not None
                ask = self._ask(action.command) if eligible else None
                request = PredictRequest(task_key, task.task_id, episode, turn, tuple(commands),
                                         tuple(fmt.wm_prompt_ids(traj.ids)), task,
                                         world_model=ask is not None and ask.go,
                                         held=ask.reason if ask is not None and not ask.go else "")
                skip = eligible and carried is None and 0 < self.busy_limit <= self.busy
                if eligible:
                    self.predictor.started(request)
                if skip:
                    self.bus.emit("spec_skipped", episode, turn, reason="busy", busy=self.busy)
                if eligible and not skip:
                    started = self.bus.now()
                    branch = carried or scope.spawn(self._branch(list(traj.ids), request, self.depth, scope,
                                                                 started))
                    carried = None
                    result, pending, outcome = await self._speculate(scope, branch, tool, action, episode, turn)
                else:
                    result = await self._execute(tool, action, episode, turn)
                    outcome = "skipped" if skip else ""
                if self.predictor is not None:
                    self.predictor.learn(request, result.body)
                ids, body = fmt.observation_ids(result.body)
                traj.append_observation(ids, body, len(fmt.obs_close_ids))
                traj.turns.append(Turn(text, "bash", action.command, result.body, result.exit_code,
                                       result.seconds, outcome))
            traj.latency_sec = self.bus.now() - t0
            traj.reward = await tool.reward()
        except INFRA_ERRORS as e:  # excluded from training, never scored 0
            traj.infra_error = f"{type(e).__name__}: {e}"
            traj.reward = None
        except asyncio.CancelledError:
            how = "cancelled"
            raise
        except Exception as e:  # a bug of ours: clean up, then fail loudly
            how, traj.reward = "failed", None
            traj.infra_error = f"bug: {type(e).__name__}: {e}"
            raise
        finally:
            await run_to_the_end(self._finish(scope, tool, traj, pending, carried, how))
        return traj

    async def _finish(self, scope: EpisodeScope, tool: Tool, traj: Trajectory, pending, carried, how: str) -> None:
        """End every request the episode started, stop every task, close the tool, report."""
        reason = "episode_end" if how == "episode_end" else "cancelled"
        try:
            if pending is not None:
                await self._cancel(pending, reason)
            if carried is not None:
                await self._drop(carried, reason)
            while scope.open or scope.tasks:
                for spec in list(scope.open):
                    await self._cancel(spec, reason)
                for t in list(scope.tasks):
                    t.cancel(reason)
                if scope.tasks:
                    # (a branch that finished meanwhile has opened speculations: loop again)
                    done, _ = await asyncio.wait(set(scope.tasks))
                    scope.tasks -= done
                    bugs = [t.exception() for t in done if not t.cancelled() and t.exception() is not None
                            and not isinstance(t.exception(), INFRA_ERRORS)]
                    if bugs and how == "episode_end":
                        raise bugs[0]
        finally:
            await tool.close()
            self.bus.emit("episode_end", traj.episode, len(traj.turns), reward=traj.reward,
                          turns=len(traj.turns), latency_sec=traj.latency_sec,
                          infra_error=traj.infra_error)

    # -- pieces -------------------------------------------------------------------------------------
    def _budget(self, context_len: int) -> int:
        return min(self.sampling.max_new_tokens, self.sampling.max_context - context_len)

    def _request(self, prompt_ids, episode: int, turn: int, priority: int = 0) -> GenerationRequest:
        s = self.sampling
        # The seed depends on (episode, turn) only, so a speculative generation of turn t+1 draws
        # exactly the random numbers the sequential one would.
        return GenerationRequest(prompt_ids, max_new_tokens=self._budget(len(prompt_ids)),
                                 temperature=s.temperature, top_p=s.top_p,
                                 seed=derive_seed(s.seed, "policy", episode, turn),
                                 stop_token_ids=self.fmt.stop_token_ids, priority=priority,
                                 adapter=self.adapter)

    def _ask(self, command: str) -> Decision:
        """Is the world model worth asking for this command's output (the gate's price of it)?"""
        return self.gate.ask(cls=program_class(command), elapsed_s=0.0, committed=self.busy)

    async def _generate(self, prompt_ids, episode: int, turn: int, speculative: bool,
                        request: GenerationRequest | None = None) -> Generation:
        request = request or self._request(prompt_ids, episode, turn)
        self.bus.emit("policy_start", episode, turn, request_id=request.request_id, speculative=speculative)
        kind = "speculative" if speculative else "committed"
        self.busy += not speculative
        t0 = self.bus.now()
        self.meter.add(kind, 1, t0)
        before = self.meter.areas(t0)
        try:
            gen = await self.policy.generate(request)
        finally:
            self.busy -= not speculative
            self.meter.add(kind, -1, self.bus.now())
        if not speculative:
            t1 = self.bus.now()
            self.gate.observe_generation(t1 - t0)
            # (the meter counted this request until a moment ago: its own share is in `committed`)
            self.gate.cost.observe(t1 - t0, len(gen.token_ids), len(prompt_ids),
                                   self.meter.mean_loads(t0, before, t1))
        self.bus.emit("policy_done", episode, turn, request_id=request.request_id,
                      tokens=len(gen.token_ids), speculative=speculative)
        return gen

    async def _execute(self, tool: Tool, action: chat.Action, episode: int, turn: int):
        self.bus.emit("exec_start", episode, turn, command=action.command)
        # the tool call's own timeout reaches the sandbox (which clamps it to its limit)
        result = await tool.run(action.command, turn, timeout=action.timeout)
        self.gate.observe_tool(program_class(action.command), result.seconds)
        self.bus.emit("exec_done", episode, turn, seconds=result.seconds, exit_code=result.exit_code,
                      hop_sec=result.hop)
        return result

    async def _speculate(self, scope: EpisodeScope, branch: asyncio.Task, tool: Tool, action: chat.Action,
                         episode: int, turn: int):
        """Run the command while `branch` (-> drafts with speculative next actions) works; then
        keep the speculation whose draft equals the real observation, if any."""
        exec_task = scope.spawn(self._execute(tool, action, episode, turn))
        try:
            await asyncio.wait({exec_task, branch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            exec_task.cancel()  # the episode's cleanup ends the branch and its requests
            raise
        specs: list[_Speculation] = []
        if not branch.done():
            # the tool finished first; if it failed, the prediction did not lose a race
            failed = not exec_task.cancelled() and exec_task.exception() is not None
            await self._drop(branch, "tool_failed" if failed else "exec_won")
            outcome = "exec_won"
        else:
            specs = branch.result()  # _branch raises only for a bug (caught by the episode)
            outcome = "pending" if specs else "no_draft"
        try:
            result = await exec_task
        except BaseException:
            for spec in specs:
                await self._cancel(spec, "tool_failed")
            raise
        if outcome != "pending":
            return result, None, outcome
        matched = next((sp for sp in specs if self.fmt.is_hit(sp.body_ids, result.body)), None)
        for spec in specs:
            if spec.decision is not None:  # every draft compared teaches the gate
                self.gate.observe_draft(spec.decision, spec is matched)
                self.bus.emit("draft_verdict", episode, turn, p=round(spec.decision.p, 4), hit=spec is matched,
                              source=spec.decision.source, cls=spec.decision.cls)
        for spec in specs:
            if spec is not matched:
                await self._cancel(spec, "rollback" if matched is None else "other_draft")
        if matched is None:
            self.bus.emit("rollback", episode, turn, drafts=len(specs), source=specs[0].draft.source)
            return result, None, "rollback"
        matched.matched_at = self.bus.now()
        if matched.task is not None:
            self.policy.promote(matched.request_id)  # it is committed work now
        if matched.task is not None and not matched.task.done():
            self.busy += 1
            matched.task.add_done_callback(self._idle_one)
        self.bus.emit("match", episode, turn, request_id=matched.request_id, draft_tokens=matched.draft.tokens,
                      source=matched.draft.source,
                      pending=matched.task is not None and not matched.task.done())
        return result, (matched if matched.task is not None else None), "match"

    def _idle_one(self, _task: asyncio.Task) -> None:
        self.busy -= 1

    async def _branch(self, prefix_ids: list[int], request: PredictRequest, depth: int,
                      scope: EpisodeScope | None = None, started: float | None = None) -> list[_Speculation]:
        """Ask the predictor for turn `request.turn`'s observation; on each distinct draft the gate
        passes, start the speculative action of the next turn (and, with depth left, speculate
        beyond it). `started`: when the command began (None: it has not, at depth > 1). The
        speculations belong to `scope` (the episode's; a test may leave it to a fresh one)."""
        scope = scope or EpisodeScope(max_turns=self.sampling.max_turns)
        episode, turn = request.episode, request.turn
        wm_id = f"wm-{episode}-{turn}-{next(self._wm_ids)}"
        self.bus.emit("wm_start", episode, turn, request_id=wm_id)
        asked = self.bus.now()
        try:
            raw = await self.predictor.predict(request)
        except asyncio.CancelledError as e:
            reason = e.args[0] if e.args else "cancelled"
            if reason == "exec_won":
                self.bus.emit("exec_won", episode, turn, request_id=wm_id)
            self._end(wm_id, "wm", "cancelled", episode, turn, reason=reason)
            raise
        except (*INFRA_ERRORS, NotServed) as e:  # the world model's engine failed, or the adapter
            # version it was asked for was unloaded meanwhile (co-training swapped it): no draft,
            # a miss; the episode goes on
            self._end(wm_id, "wm", "failed", episode, turn, reason=repr(e))
            return []
        except BaseException as e:  # a bug: accounted for, then loud
            self._end(wm_id, "wm", "failed", episode, turn, reason=repr(e))
            raise
        drafts = self._distinct(raw)
        tokens = sum(d.tokens for d in raw)
        cls = program_class(request.commands[-1])
        if raw and raw[0].source == "world_model":
            self.gate.observe_world_model(cls, self.bus.now() - asked)
        if not raw and not request.world_model:  # no model-free draft, and the world model not worth asking
            self.bus.emit("gate", episode, turn, go=False, reason=request.held or "wm_cost", p=None,
                          gain_s=None, source="world_model", cls=cls)
        self.bus.emit("wm_draft", episode, turn, request_id=wm_id, drafts=len(drafts), tokens=tokens,
                      unusable=sum(1 for d in raw if d.body is None and not d.too_long),
                      too_long=sum(1 for d in raw if d.too_long), source=raw[0].source if raw else "")
        self._end(wm_id, "wm", "committed", episode, turn, tokens=tokens)
        specs = []
        elapsed = self.bus.now() - started if started is not None else 0.0
        stats = self.policy.scheduling_stats()
        if stats.measured:
            self.gate.observe_cost((stats - self._stats).committed_delay_sec, self._spec_started)
            self._stats, self._spec_started = stats, 0
        for k, (draft, ids, body) in enumerate(drafts):
            decision = self.gate.decide(source=draft.source, cls=cls, confidence=draft.confidence,
                                        elapsed_s=elapsed, committed=self.busy)
            self.bus.emit("gate", episode, turn, go=decision.go, reason=decision.reason, p=round(decision.p, 4),
                          gain_s=round(decision.gain_s, 4), source=draft.source, cls=cls,
                          explore=decision.explore)
            spec = _Speculation(draft, ids[body], episode, turn + 1, decision, scope=scope)
            prompt = list(prefix_ids) + ids
            if decision.go and turn + 1 < scope.max_turns and self._budget(len(prompt)) > 0:
                # Low priority: speculation only uses compute that committed work leaves idle.
                req = self._request(prompt, episode, turn + 1, priority=1)
                self.bus.emit("spec_start", episode, turn + 1, request_id=req.request_id, draft=k)
                self._spec_started += 1
                spec.request_id = req.request_id
                spec.task = scope.spawn(self._generate(prompt, episode, turn + 1, True, req))
                scope.open.add(spec)
                if depth > 1:
                    spec.deeper = scope.spawn(self._deeper(scope, prompt, spec.task, request, depth - 1))
            specs.append(spec)  # with no task, the draft is still compared (nothing follows it)
        return specs

    async def _deeper(self, scope: EpisodeScope, prompt: list[int], gen_task: asyncio.Task,
                      request: PredictRequest, depth: int) -> list[_Speculation]:
        """Once a speculative action exists, speculate on its observation in turn (depth > 1)."""
        await asyncio.wait({gen_task})  # waits without cancelling the generation if we are cancelled
        if gen_task.cancelled() or gen_task.exception() is not None:
            return []
        gen = gen_task.result()
        action = self.fmt.parse(self.fmt.decode(gen.token_ids))
        if action.kind != "bash":
            return []
        ids = prompt + list(gen.token_ids)
        nxt = PredictRequest(request.task_key, request.task_id, request.episode, request.turn + 1,
                             request.commands + (action.command,), tuple(self.fmt.wm_prompt_ids(ids)),
                             request.task, world_model=(ask := self._ask(action.command)).go,
                             held=ask.reason if not ask.go else "")
        return await self._branch(ids, nxt, depth, scope)

    async def _collect(self, spec: _Speculation) -> Generation:
        scope = spec.scope
        try:
            gen = await spec.task
        except asyncio.CancelledError:
            raise  # (the episode is being cancelled: its cleanup ends this request)
        except BaseException as e:
            scope.open.discard(spec)
            self._end(spec.request_id, "policy", "failed", spec.episode, spec.turn, reason=repr(e))
            raise
        scope.open.discard(spec)
        self._end(spec.request_id, "policy", "committed", spec.episode, spec.turn, tokens=len(gen.token_ids))
        if spec.matched_at is not None:  # what the hit hid: a generation's time, less what the turn still waited
            self.gate.observe_hidden(spec.draft.source, self.gate.gen_s() - (self.bus.now() - spec.matched_at))
        return gen

    async def _drop(self, branch: asyncio.Task, reason: str) -> None:
        """Cancel a branch and everything speculated on it."""
        if not branch.done():
            branch.cancel(reason)
        await asyncio.wait({branch})  # raises only if we are cancelled ourselves
        specs = [] if branch.cancelled() or branch.exception() is not None else branch.result()
        for spec in specs:
            await self._cancel(spec, reason)
        if not branch.cancelled() and branch.exception() is not None:
            raise branch.exception()  # a bug in _branch (a failing predictor is no exception)

    async def _cancel(self, spec: _Speculation, reason: str) -> None:
        scope = spec.scope
        if spec.deeper is not None:
            await self._drop(spec.deeper, reason)
        if spec.task is None or spec not in scope.open:
            return  # no request, or its end is already told
        if not spec.task.done():
            if not self.policy.cancel(spec.request_id):
                spec.task.cancel()
        # asyncio.wait never raises the generation's own CancelledError: one raised here is ours
        await asyncio.wait({spec.task})
        scope.open.discard(spec)
        if spec.task.cancelled():
            tokens = 0
        elif spec.task.exception() is not None:
            self._end(spec.request_id, "policy", "failed", spec.episode, spec.turn,
                      reason=repr(spec.task.exception()))
            return
        else:
            tokens = len(spec.task.result().token_ids)
        self._end(spec.request_id, "policy", "cancelled", spec.episode, spec.turn, reason=reason, tokens=tokens)

    def _end(self, request_id: str, role: str, outcome: str, episode: int, turn: int,
             reason: str = "", tokens: int = 0) -> None:
        self.bus.emit("request_end", episode, turn, request_id=request_id, role=role,
                      outcome=outcome, reason=reason, tokens=tokens)

    def _distinct(self, drafts: list[Draft]) -> list[tuple[Draft, list[int], slice]]:
        """Normalise and encode drafts exactly as real observations are (-> draft, observation ids,
        where the body sits); drop unusable ones and duplicates (by body ids)."""
        seen, out = set(), []
        for d in drafts:
            if d.body is None:
                continue
            body, ids, span = self.fmt.draft_observation_ids(d.body, self.cap)
            if tuple(ids[span]) not in seen:
                seen.add(tuple(ids[span]))
                out.append((Draft(body, d.tokens, d.source, d.confidence), ids, span))
        return out

    # -- a batch ------------------------------------------------------------------------------------
    async def run_batch(self, tasks: list[Task], make_tool, speculative: bool,
                        concurrency: int = 0, first_episode: int = 0) -> list[Trajectory]:
        """Episodes `first_episode + i` for tasks[i], all at once (or `concurrency` at a time).
        A bug in one episode (or a cancellation from outside) stops all of them, each cleaned up;
        an episode whose sandbox was lost (a Ray worker died) runs again if its tool says so."""
        gate = asyncio.Semaphore(concurrency or len(tasks) or 1)

        async def one(i: int, task: Task) -> Trajectory:
            async with gate:
                episode = first_episode + i
                for attempt in itertools.count(1):
                    tool = make_tool(task, episode)
                    traj = await self.run_episode(task, episode, tool, speculative)
                    # an episode whose sandbox's machine went away runs again from its start, with
                    # the same seeds (so the same tokens), as often as its tool allows
                    if not (traj.infra_error and getattr(tool, "lost", False)
                            and attempt <= getattr(tool, "retries", 0)):
                        return traj
                    self.bus.emit("episode_retry", episode, 0, attempt=attempt, infra_error=traj.infra_error)

        t0 = self.bus.now()
        before = self.meter.areas(t0)
        runs = [asyncio.ensure_future(one(i, t)) for i, t in enumerate(tasks)]
        try:
            await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION) if runs else None
        finally:
            stopped = [r for r in runs if not r.done()]
            for r in stopped:
                r.cancel()
            if stopped:
                await run_to_the_end(asyncio.wait(stopped))
        for r in runs:
            if not r.cancelled() and r.exception() is not None:
                raise r.exception()
        # what the gate learned, at this batch's mean committed load (summary.json's `gate`)
        load = self.meter.mean_loads(t0, before, self.bus.now())["committed"]
        self.bus.emit("gate_state", -1, 0, **self.gate.summary(load))
        return [r.result() for r in runs]
