"""The rollout function TRL's GRPOTrainer calls: speculative episodes in real sandboxes -> rows.

    rollouts = Rollouts(tasks, settings, policy_engine, predictor, out_dir)
    GRPOTrainer(..., rollout_func=rollouts, reward_funcs=[rollouts.reward])

TRL calls `rollouts(prompts, trainer)` once per step on every process, with that process's slice
of the generation batch. A prompt is a task id (the dataset's `prompt` column), already repeated
`group_size` times in a row (trl 1.16 repeats them before the call). All the slice's episodes run
at once through the one batch driver (obsspec/rollout/batch.py), so group members share the
engine's batches and the history cache. One row per episode:
- `prompt_ids`      the instruction as the policy saw it;
- `completion_ids`  actions and observations, ending with EOS (appended, masked, after a last
                    observation: TRL drops rows that do not end with EOS when asked to);
- `logprobs`        the sampled tokens' logprobs (0.0 on observation tokens);
- `env_mask`        1 on the policy's own tokens, 0 on observations: only actions are trained;
- `verifier_reward` the verifier's reward, or None for an infrastructure failure. TRL turns a
                    None into NaN, leaves it out of its group's mean and std and gives it zero
                    advantage; its env_mask is all 0 as well, so the row adds no gradient at all.
Episode numbers (and so the sampling seeds) follow from the step and the process: a resumed run
draws exactly the seeds the uninterrupted one would have.

Each step's episodes are written like an `obsspec rollout` run under
`rollouts/step-NNNNNN/` (episodes.jsonl, trajectories-<mode>.jsonl, trace-<mode>.jsonl,
summary.json), so `obsspec report` and `obsspec rollout --replay` read them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field

from obsspec.commands import command_class
from obsspec.env.task import Task
from obsspec.rollout.batch import Live, mode_name, run_episodes, write_summary
from obsspec.rollout.metrics import SpecMetrics
from obsspec.rollout.predictors import world_model_of
from obsspec.rollout.scheduler import Sampling
from obsspec.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class RolloutSettings:
    sampling: Sampling
    cap: int                       # sandbox.output_cap
    speculative: bool
    depth: int
    episodes_per_step: int         # over all processes
    make_tool: object              # (task, episode) -> Tool
    concurrency: int = 0
    busy_limit: int = 0            # rollout.busy_limit
    gate: object = None            # the speculation gate (rollout/gate.py), its estimates kept over steps
    paired: bool = False           # train.measure_speculation: each step also runs sequentially (same seeds)


@dataclass
class StepRollouts:
    """What one step's rollouts produced on this process."""

    step: int                                  # the optimizer step these rollouts feed (1-based)
    trajectories: list[Trajectory]
    metrics: dict
    class_hits: dict = field(default_factory=dict)   # command class -> [matches, verified drafts]
    sec: float = 0.0
    by_kind: dict = field(default_factory=dict)      # "family/kind" -> [successes, scored episodes]
    spec: SpecMetrics | None = None                  # what `metrics` was computed from (mergeable)
    counts: Counter = field(default_factory=Counter)  # outcome and cache counts (mergeable)

    def summarise(self) -> None:
        """`metrics` from `spec` and `counts`."""
        self.metrics = self.spec.summary() if self.spec is not None else {}
        self.metrics.update(outcome_metrics_of(self.counts))
        self.metrics.update(paired_metrics_of(self.counts))
        if "cache/lookups" in self.counts:
            lookups, hits = self.counts["cache/lookups"], self.counts["cache/hits"]
            self.metrics.update({"cache/lookups": lookups, "cache/hits": hits,
                                 "cache/hit_frac": hits / lookups if lookups else None})


def merge_steps(parts: list[StepRollouts]) -> StepRollouts:
    """One step's rollouts of every process as one (trajectories stay with their process): the
    metrics of all episodes, not of the main process's share."""
    spec, counts, class_hits_, by_kind = SpecMetrics(), Counter(), Counter(), Counter()
    for part in parts:
        if part.spec is not None:
            spec.merge(part.spec)
        counts.update(part.counts)
        for table, into in ((part.class_hits, class_hits_), (part.by_kind, by_kind)):
            for key, (won, seen) in table.items():
                into[key, 0] += won
                into[key, 1] += seen
    first = parts[0]

    def back(table):
        return {k: [table[k, 0], table[k, 1]] for k in sorted({k for k, _ in table})}

    merged = StepRollouts(first.step, first.trajectories, {}, back(class_hits_), max(p.sec for p in parts),
                          back(by_kind), spec, counts)
    merged.summarise()
    merged.metrics["processes"] = len(parts)
    return merged


class Rollouts:
    def __init__(self, tasks: dict[str, Task], settings: RolloutSettings, policy, fmt, predictor,
                 out_dir: str, rank: int = 0, live: Live | None = None):
        self.tasks, self.settings, self.policy, self.fmt = tasks, settings, policy, fmt
        self.predictor, self.out_dir, self.rank = predictor, out_dir, rank
        self.live = live
        self.last: StepRollouts | None = None
        self.policy_adapter: str | None = None   # set by PolicySync when the engine is a server
        self.sync = None              # called with the trainer before each step's rollouts
        self.before_rollouts = []     # callables run before each step's rollouts (adapter swaps)
        self.after_rollouts = []      # callables given each StepRollouts (co-training)

    # -- the rollout function --------------------------------------------------------------------
    def __call__(self, prompts: list[str], trainer) -> dict:
        step = trainer.state.global_step + 1
        first = (step - 1) * self.settings.episodes_per_step + self.rank * len(prompts)
        if self.sync is not None:
            self.sync(trainer)        # the trainer's current weights reach the policy's server
        for hook in self.before_rollouts:
            hook(step)
        unknown = sorted({p for p in prompts if p not in self.tasks})
        if unknown:
            raise KeyError(f"prompts that are not task ids of this run: {unknown[:3]}")
        tasks = [self.tasks[p] for p in prompts]
        if self.settings.paired and self.settings.speculative:
            result = self.run_paired(tasks, step, first)
        else:
            result = self.run(tasks, step, first)
        if getattr(getattr(trainer, "accelerator", None), "num_processes", 1) > 1:
            # every process rolled out its share: the step's metrics are those of all of them
            # (rank 0 alone would hide, among others, the other ranks' infra failures)
            from accelerate.utils import gather_object

            parts = [StepRollouts(result.step, [], {"spec/exact_frac": result.metrics.get("spec/exact_frac")},
                                  result.class_hits, result.sec, result.by_kind, result.spec, result.counts)]
            gathered = gather_object(parts)
            merged = merge_steps(gathered)
            # the hit rate of each process's drafts (all of them draft with the same world model)
            merged.metrics.update({f"spec/exact_frac/rank{k}": p.metrics.get("spec/exact_frac")
                                   for k, p in enumerate(gathered)})
            merged.trajectories = result.trajectories
            self.last = merged
        for hook in self.after_rollouts:
            hook(result)
        return self.rows(result.trajectories)

    def run_paired(self, tasks: list[Task], step: int, first_episode: int) -> StepRollouts:
        """The step's episodes twice, on the same seeds: speculatively (these train) and
        sequentially (a measurement), in alternating order from step to step so that a drift of
        the machine falls on both alike; both are written to the step's folder. The sequential
        pass never reaches the predictor, so it feeds no cache the speculative pass reads."""
        from obsspec.rollout_run import compare

        out = self._step_dir(step)
        sequential = dataclasses.replace(self.settings, speculative=False)
        order = (sequential, self.settings) if step % 2 else (self.settings, sequential)
        runs = {s.speculative: self.run(tasks, step, first_episode, settings=s, out=out, fresh=False, label="",
                                        title=f"step {step} rollouts ({mode_name(s.speculative)}, paired)")
                for s in order}
        spec, seq = runs[True], runs[False]
        c = compare(seq.trajectories, spec.trajectories)
        spec.counts.update({
            "paired/steps": 1, "paired/seq_sec": seq.sec, "paired/spec_sec": spec.sec,
            "paired/compared": c["episodes_compared_for_latency"],
            "paired/seq_latency": (c["latency_mean_sequential_sec"] or 0) * c["episodes_compared_for_latency"],
            "paired/spec_latency": (c["latency_mean_speculative_sec"] or 0) * c["episodes_compared_for_latency"],
            "paired/episodes_differing": len(c["episodes_differing"]),
            "paired/episodes_differing_in_action": len(c["differing_first_in_action"]),
            "paired/tokens_differing": c["tokens_differing"]})
        spec.summarise()
        write_summary(out, {"command": "train", "step": step, "episodes": len(tasks),
                            "modes": {"sequential": seq.metrics, "speculative": spec.metrics},
                            "comparison": c, "spec/class_hits": spec.class_hits, "success_by_kind": spec.by_kind})
        self.last = spec
        return spec

    def run(self, tasks: list[Task], step: int, first_episode: int, label: str = "",
            settings: RolloutSettings | None = None, out: str = "", fresh: bool = True,
            title: str = "") -> StepRollouts:
        """Run episodes `first_episode + i` on `tasks`, written under `out` (default
        rollouts/step-NNNNNN/; `fresh`: an existing one is set aside first). With a `label`:
        outside the training steps (val evaluation, with its own `settings`), so `last` stays
        the last step's."""
        s = settings or self.settings
        out = (_fresh_dir(out) if fresh else out) if out else self._step_dir(step)
        t0 = time.monotonic()
        cache_before = (getattr(self.predictor, "lookups", 0), getattr(self.predictor, "hits", 0))
        batch = asyncio.run(run_episodes(
            self.policy, self.fmt, tasks, s.make_tool, s.sampling, cap=s.cap, speculative=s.speculative,
            predictor=self.predictor, depth=s.depth, busy_limit=s.busy_limit, gate=s.gate, concurrency=s.concurrency,
            first_episode=first_episode, adapter=self.policy_adapter, out_dir=out, live=self.live,
            title=title or label or f"step {step} rollouts"))
        trajectories = batch.trajectories
        counts = outcome_counts(trajectories)
        if hasattr(self.predictor, "lookups") and s.speculative:  # this step's, not cumulative
            counts["cache/lookups"] = self.predictor.lookups - cache_before[0]
            counts["cache/hits"] = self.predictor.hits - cache_before[1]
        result = StepRollouts(step, trajectories, {}, class_hits(trajectories), time.monotonic() - t0,
                              success_by_kind(tasks, trajectories), batch.metrics, counts)
        result.summarise()
        inner = world_model_of(self.predictor)
        write_summary(out, {"command": "train", "step": result.step, "episodes": len(tasks),
                            "modes": {batch.mode: result.metrics}, "spec/class_hits": result.class_hits,
                            "success_by_kind": result.by_kind,
                            "world_model_adapter": getattr(inner, "adapter", None) if s.speculative else None})
        if not label:
            self.last = result
        return result

    def reward(self, prompts=None, completions=None, verifier_reward=None, log_metric=None, **_) -> list:
        """TRL reward function: the verifier's reward each row carries (None = infra failure),
        and this step's rollout metrics logged alongside TRL's own."""
        if log_metric is not None and self.last is not None:
            for name, value in scalar_metrics(self.last.metrics).items():
                log_metric(name, value)
        return list(verifier_reward)

    # -- rows and files ---------------------------------------------------------------------------
    def rows(self, trajectories: list[Trajectory]) -> dict:
        eos = self.fmt.tokenizer.eos_token_id
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
               "verifier_reward": [], "infra_error": []}
        for tr in trajectories:
            p = tr.prompt_len
            # An observation after the policy's last token (the episode ran out of turns or
            # context) trains nothing, and one command can make it ~4 tokens a character of the
            # output cap: it is not sent (a 17k-token row against a 2k context was seen).
            end = 1 + max((i for i, m in enumerate(tr.policy_mask) if m), default=len(tr.ids) - 1)
            ids, lps, mask = tr.ids[p:end], tr.logprobs[p:end], tr.policy_mask[p:end]
            if not ids or ids[-1] != eos:
                ids, lps, mask = ids + [eos], lps + [0.0], mask + [0]
            if tr.infra_error:
                mask = [0] * len(ids)  # no gradient from an episode the infrastructure broke
            out["prompt_ids"].append(tr.ids[:p])
            out["completion_ids"].append(ids)
            out["logprobs"].append(lps)
            out["env_mask"].append(mask)
            out["verifier_reward"].append(None if tr.infra_error else tr.reward)
            out["infra_error"].append(tr.infra_error)
        return out

    def step_dir(self, step: int, rank: int) -> str:
        """Where process `rank` writes step `step`'s rollouts."""
        return os.path.join(self.out_dir, "rollouts", f"step-{step:06d}" + (f".rank{rank}" if rank else ""))

    def _step_dir(self, step: int) -> str:
        return _fresh_dir(self.step_dir(step, self.rank))


def _fresh_dir(path: str) -> str:
    """An empty `path`. One that exists (a step or val run redone after a resume) is kept aside
    as its sibling discarded/NAME.TIME."""
    if os.path.isdir(path):
        shutil.move(path, os.path.join(os.path.dirname(path), "discarded",
                                       f"{os.path.basename(path)}.{int(time.time())}"))
    os.makedirs(path)
    return path


# ---------------------------------------------------------------------------------------------
# Per-step figures


def outcome_metrics(trajectories: list[Trajectory]) -> dict:
    """Success and infrastructure failures over a step's episodes (infra failures excluded from
    the success rate: they are neither successes nor failures of the agent)."""
    return outcome_metrics_of(outcome_counts(trajectories))


def outcome_counts(trajectories: list[Trajectory]) -> Counter:
    scored = [t.reward for t in trajectories if not t.infra_error and t.reward is not None]
    return Counter(episodes=len(trajectories), scored=len(scored), won=sum(r >= 1.0 for r in scored),
                   infra=sum(1 for t in trajectories if t.infra_error), turns=sum(len(t.turns) for t in trajectories))


def paired_metrics_of(counts: Counter) -> dict:
    """With paired steps (train.measure_speculation): the measured reductions of the step's mean
    episode latency (over the token-identical episodes) and of its rollout wall time, speculative
    against sequential on the same seeds, and how many episodes and tokens differed."""
    if not counts["paired/steps"]:
        return {}
    seq, spec = counts["paired/seq_latency"], counts["paired/spec_latency"]
    return {"paired/latency_reduction": 1 - spec / seq if seq else None,
            "paired/rollout_reduction": 1 - counts["paired/spec_sec"] / counts["paired/seq_sec"]
            if counts["paired/seq_sec"] else None,
            "paired/seq_sec": counts["paired/seq_sec"], "paired/spec_sec": counts["paired/spec_sec"],
            "paired/episodes_compared": counts["paired/compared"],
            "paired/episodes_differing": counts["paired/episodes_differing"],
            "paired/episodes_differing_in_action": counts["paired/episodes_differing_in_action"],
            "paired/tokens_differing": counts["paired/tokens_differing"]}


def outcome_metrics_of(counts: Counter) -> dict:
    return {"success_frac": counts["won"] / counts["scored"] if counts["scored"] else None,
            "infra_failures": counts["infra"],
            "turns_mean": counts["turns"] / max(1, counts["episodes"])}


def success_by_kind(tasks: list[Task], trajectories: list[Trajectory]) -> dict:
    """"family/kind" (the family alone for a task without a kind) -> [successes, scored episodes];
    infra failures are left out, as in the success rate."""
    won, scored = Counter(), Counter()
    for task, tr in zip(tasks, trajectories, strict=True):
        if tr.infra_error or tr.reward is None:
            continue
        key = f"{task.family}/{task.kind}" if task.kind else task.family
        scored[key] += 1
        won[key] += tr.reward >= 1.0
    return {k: [won[k], scored[k]] for k in sorted(scored)}


def success_by_task(tasks, trajectories) -> dict:
    """task id -> [successes, scored episodes] (infra failures left out)."""
    out: dict = {}
    for task, tr in zip(tasks, trajectories, strict=True):
        if tr.infra_error or tr.reward is None:
            continue
        won, seen = out.get(task.task_id, (0, 0))
        out[task.task_id] = [won + (tr.reward >= 1.0), seen + 1]
    return out


def class_hits(trajectories: list[Trajectory]) -> dict:
    """Command class -> [matches, drafts verified] over the step's bash turns."""
    hits, seen = Counter(), Counter()
    for tr in trajectories:
        for turn in tr.turns:
            if turn.kind == "bash" and turn.spec in ("match", "rollback"):
                c = command_class(turn.command, turn.observation)
                seen[c] += 1
                hits[c] += turn.spec == "match"
    return {c: [hits[c], seen[c]] for c in sorted(seen)}


def scalar_metrics(metrics: dict) -> dict:
    """The numeric entries of a metrics dict (what TensorBoard and log_metric can take)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
