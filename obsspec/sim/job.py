"""What speculation would save on a team's own Harbor jobs: `obsspec simulate --from JOB_DIR`.

    result = simulate_job(SimConfig(), ["jobs/2026-04-15__16-35-22"], grid={"workload.concurrency": [8, 32]})

The trials' ATIF trajectories (obsspec/atif.py) give the workload, measured:
- per turn: the model's generation time and tokens (its tokens/s sets the engine's single-stream
  speed), the tool time (recorded, or the terminal waits the agent asked for), the command class;
- per episode: its turns; per task: its trials (GRPO's siblings);
- per step, what the model-free tiers would have hit: an empty output (`empty`), an output
  identical to an earlier one in the same episode (`repeat`), or one identical to an earlier
  sibling trial's for the same command history (`sibling`: of a group of identical ones, the first
  has nobody's result to take). Those drafts are instant and exact.
The rest go to a world model whose hit rate is given (`spec.hit_rate`, the paper's 66.4 % by
default) and whose latency is `world_model.*`. Every grid point (concurrency, an engine preset's
speeds, the hit rate, ...) is simulated `seeds` times on other draws of the world model's hits;
each reports the reduction of mean episode latency and of a synchronous step's makespan (all
episodes at once, the step ends with the last), with a 95 % interval over the draws, overall and
per task. The report says what it measured and what it assumed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import statistics
from collections import Counter

from obsspec.atif import Trial, find_trials, read_trials
from obsspec.commands import command_class
from obsspec.rollout.metrics import mean_interval
from obsspec.sim.config import SimConfig, SimError, apply_overrides, to_dict
from obsspec.sim.episodes import SimTurn, simulate_batch

TIERS = ("empty", "repeat", "sibling")


def is_job(path: str) -> bool:
    """Is `path` Harbor trials (a job, a trial, folders of them) rather than an obsspec rollout run?"""
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "trajectories-sequential.jsonl")):
        return False
    return bool(find_trials([path]))


class RecordedJob:
    def __init__(self, trials: list[Trial], skipped: list[tuple[str, str]]):
        if not trials:
            why = f" ({len(skipped)} skipped: {skipped[0][1]})" if skipped else ""
            raise SimError(f"no readable Harbor trial (agent/trajectory.json) found{why}")
        self.trials, self.skipped = trials, skipped
        self.tiers = self._tiers()

    @classmethod
    def load(cls, paths: list[str]) -> "RecordedJob":
        try:
            return cls(*read_trials(paths))
        except ValueError as e:
            raise SimError(str(e)) from None

    def _tiers(self) -> dict[tuple[int, int], str]:
        """(trial, step) -> the model-free tier that would have had its observation exactly."""
        out = {}
        for i, trial in enumerate(self.trials):
            history, earlier = (), set()
            for k, step in enumerate(trial.steps):
                history += tuple(step.commands)
                if not step.observation.strip():
                    out[(i, k)] = "empty"
                elif step.observation in earlier:
                    out[(i, k)] = "repeat"
                elif self._sibling_has(trial, history, step.observation):
                    out[(i, k)] = "sibling"
                earlier.add(step.observation)
        return out

    def _sibling_has(self, trial: Trial, history: tuple, observation: str) -> bool:
        """Did an earlier trial of the same task see `observation` after the same commands? (Of
        siblings that run a command at once, one runs it first and has nobody's result to take:
        one of each identical group is no hit.)"""
        for other in self.trials:
            if other is trial:
                return False  # (the trials before it in the job's order only)
            if other.task != trial.task:
                continue
            h: tuple = ()
            for step in other.steps:
                h += tuple(step.commands)
                if len(h) > len(history) or h != history[:len(h)]:
                    break
                if h == history and step.observation == observation:
                    return True
        return False

    # -- what was measured -------------------------------------------------------------------------
    def measured(self) -> dict:
        steps = [s for t in self.trials for s in t.steps]
        gens = [s.gen_s for s in steps]
        tokens = sum(s.completion_tokens for s in steps)
        tiers = Counter(self.tiers.values())
        return {
            "trials": len(self.trials), "tasks": len({t.task for t in self.trials}),
            "skipped": [{"trial": os.path.basename(p), "why": w} for p, w in self.skipped],
            "steps": len(steps),
            "turns_per_episode": statistics.fmean(len(t.steps) for t in self.trials),
            "generation_s": _spread(gens), "tool_s": _spread([s.tool_s for s in steps]),
            "completion_tokens_per_turn": statistics.fmean(s.completion_tokens for s in steps) if steps else 0.0,
            "tokens_per_s": tokens / sum(gens) if sum(gens) > 0 and tokens else None,
            "model_free_hits": {k: tiers.get(k, 0) for k in TIERS},
            "model_free_share": sum(tiers.values()) / len(steps) if steps else 0.0,
            "reward_mean": statistics.fmean(t.reward for t in self.trials if t.reward is not None)
            if any(t.reward is not None for t in self.trials) else None,
            "assumed": sorted({a for t in self.trials for a in t.assumed}),
        }

    def config(self, base: SimConfig) -> SimConfig:
        """`base` with the job's episodes and the model's measured single-stream speed."""
        m = self.measured()
        engine = base.engine
        if m["tokens_per_s"]:
            engine = dataclasses.replace(engine, single_tok_s=m["tokens_per_s"],
                                         peak_tok_s=max(engine.peak_tok_s, m["tokens_per_s"]))
        workload = dataclasses.replace(base.workload, episodes=len(self.trials))
        return dataclasses.replace(base, engine=engine, workload=workload)

    def workload(self, cfg: SimConfig, seed: int) -> list[list[SimTurn]]:
        """The recorded turns; a step the model-free tiers had is an instant exact draft, the others
        the world model's, right with probability spec.hit_rate (drawn with `seed`)."""
        rng = random.Random(f"job:{seed}")
        out = []
        for i, trial in enumerate(self.trials):
            turns, prompt = [], 0.0
            for k, step in enumerate(trial.steps):
                tier = self.tiers.get((i, k))
                tokens = float(step.completion_tokens or max(1.0, step.gen_s * cfg.engine.single_tok_s))
                hit = tier is not None or rng.random() < cfg.spec.hit_rate
                wm = 0.0 if tier is not None else cfg.world_model.latency()
                cls = command_class(step.commands[0] if step.commands else "", step.observation)
                turns.append(SimTurn(tokens, "bash", step.tool_s, wm, hit, cls, float(step.prompt_tokens or prompt),
                                     rng.random()))
                prompt += tokens
            # the answer: one more generation after the last observation
            turns.append(SimTurn(float(trial.steps[-1].completion_tokens or 1), "done", 0.0, 0.0, False, "done",
                                 prompt, rng.random()))
            out.append(turns)
        return out


def _spread(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "n": 0}
    return {"mean": round(statistics.fmean(values), 4), "median": round(statistics.median(values), 4),
            "n": len(values)}


def simulate_job(cfg: SimConfig, paths: list[str], grid: dict[str, list] | None = None, out_dir: str = "",
                 overrides: list[str] = (), seeds: int = 8) -> dict:
    """Every grid point over `seeds` draws: the reduction of mean episode latency and of the
    step's makespan, overall and per task, each with its 95 % interval."""
    job = RecordedJob.load(paths)
    base = apply_overrides(job.config(cfg), list(overrides))
    grid = dict(grid or {})
    tasks = sorted({t.task for t in job.trials})
    rows = []
    for values in itertools.product(*grid.values()) if grid else [()]:
        point = dict(zip(grid, values))
        pcfg = apply_overrides(base, [f"{k}={v}" for k, v in point.items()])
        latency, makespan, by_task = [], [], {t: [] for t in tasks}
        for seed in range(seeds):
            workload = job.workload(pcfg, seed)
            seq = simulate_batch(pcfg, workload, speculative=False)
            spec = simulate_batch(pcfg, workload, speculative=True)
            latency.append(1 - spec.total_latency / seq.total_latency if seq.total_latency else 0.0)
            # a synchronous step: every episode at once, the step ends with its last episode
            sync = dataclasses.replace(pcfg, workload=dataclasses.replace(pcfg.workload, concurrency=0))
            s_seq, s_spec = simulate_batch(sync, workload, False), simulate_batch(sync, workload, True)
            makespan.append(1 - s_spec.makespan / s_seq.makespan if s_seq.makespan else 0.0)
            for task in tasks:
                idx = [i for i, t in enumerate(job.trials) if t.task == task]
                a = sum(seq.episodes[i].latency for i in idx)
                b = sum(spec.episodes[i].latency for i in idx)
                by_task[task].append(1 - b / a if a else 0.0)
        rows.append({**point, "episode_latency_reduction": mean_interval(latency),
                     "step_makespan_reduction": mean_interval(makespan),
                     "by_task": {t: mean_interval(v) for t, v in by_task.items()}})
    result = {"command": "simulate", "from_job": list(paths), "seeds": seeds, "grid": grid,
              "measured": job.measured(), "base": to_dict(base),
              "assumed": ["world model: hit rate spec.hit_rate on the steps the model-free tiers did not have, "
                          "latency world_model.* (not measured on these jobs)",
                          "engine: the job's measured tokens/s single stream; the aggregate speed, batch and "
                          "scheduling from engine.* (a preset or the defaults)",
                          *job.measured()["assumed"]],
              "rows": rows}
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "simulate.json"), "w") as f:
            json.dump(result, f, indent=2)
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump({"command": "simulate", "from_job": list(paths), "points": len(rows), "out_dir": out_dir,
                       "trials": len(job.trials), "skipped": len(job.skipped)}, f, indent=2)
    return result


def job_table(result: dict) -> str:
    """Plain lines: what was measured, what was assumed, and each point's predictions."""
    m = result["measured"]
    pct = lambda ci: (f"{100 * ci['mean']:+.1f} % ± {100 * ci['ci95']:.1f}" if ci and ci.get("ci95") is not None
                      else "-")
    lines = [f"{m['trials']} trials of {m['tasks']} tasks ({len(m['skipped'])} skipped), {m['steps']} tool steps, "
             f"{m['turns_per_episode']:.1f} a trial",
             f"measured: generation {m['generation_s']['median']} s median a turn, tool {m['tool_s']['median']} s "
             f"median a step, {m['tokens_per_s'] or 0:.0f} tokens/s; model-free tiers would have had "
             f"{100 * m['model_free_share']:.1f} % of steps ({', '.join(f'{k} {v}' for k, v in m['model_free_hits'].items())})",
             *(f"assumed: {a}" for a in result["assumed"])]
    for skip in m["skipped"][:10]:
        lines.append(f"skipped {skip['trial']}: {skip['why']}")
    for row in result["rows"]:
        point = ", ".join(f"{k}={v}" for k, v in row.items() if k not in
                          ("episode_latency_reduction", "step_makespan_reduction", "by_task")) or "as recorded"
        lines.append(f"{point}: episode latency {pct(row['episode_latency_reduction'])}, "
                     f"step makespan {pct(row['step_makespan_reduction'])} (95 % over {result['seeds']} draws)")
        for task, ci in row["by_task"].items():
            lines.append(f"    {task}: {pct(ci)}")
    return "\n".join(lines)
