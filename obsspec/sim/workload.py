"""Workloads for the simulator: drawn from a `SimConfig`, or taken from a recorded rollout run.

    workload = synthetic(cfg)                       # list (episodes) of lists (turns) of SimTurn
    recorded = RecordedRun.load("runs/rollout")     # measured turns, latencies, hit rates, engine speed
    cfg, workload = recorded.config(), recorded.workload(cfg, resample={"tool"})

Synthetic draws use common random numbers: every turn draws the same uniforms whatever the
parameters, so two grid points differ only by the parameter that changed. A recorded run gives,
per episode and turn, the action's token count (from `policy_mask`), the kind, the tool latency,
the command class (obsspec/commands.py, as in the training metrics), whether the draft matched (`match`/`rollback` in the speculative
trajectories; other turns draw from the measured per-class hit rate) and the world model's
latency (from the speculative trace; `exec_won` turns never get a draft in time). The engine's
step model (single-stream and aggregate tokens/s) is fitted on the sequential run's generations:
seconds per token against how many generations ran alongside; a processor-sharing fit (the hf
engine's batch-invariant mode) also sets low-priority speculation, as that engine serves it.
Episodes that were not token-identical between the modes are left out, as the measured
reduction leaves them out.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import statistics
from dataclasses import dataclass

from obsspec.commands import command_class
from obsspec.rollout.trajectory import action_spans
from obsspec.sim.config import SimConfig, SimError, parse_classes
from obsspec.sim.episodes import SimTurn


def _hit_rate(cfg: SimConfig, cls: str) -> float:
    return cfg.spec.rates().get(cls, cfg.spec.hit_rate)


def _lognormal_mean1(sigma: float, z: float) -> float:
    return math.exp(sigma * z - sigma * sigma / 2)


def _confidence_draws(seed: int) -> random.Random:
    """A stream of its own for the drafts' confidences: adding it left every other draw as it was."""
    return random.Random(f"{seed}:confidence")


def synthetic(cfg: SimConfig) -> list[list[SimTurn]]:
    w, rng = cfg.workload, random.Random(cfg.workload.seed)
    conf_rng = _confidence_draws(w.seed)
    mix = parse_classes(cfg.spec.class_mix)
    classes = list(mix.items())
    out = []
    for _ in range(w.episodes):
        turns, ends_done, prompt = [], rng.random() < w.done_frac, w.prompt_tokens
        for k in range(w.turns):
            u_tok, u_cls, u_hit = rng.random(), rng.random(), rng.random()
            tool_rng = random.Random(rng.random())  # its own stream: tool.kind never shifts the others
            z = statistics.NormalDist().inv_cdf(min(max(u_tok, 1e-9), 1 - 1e-9))
            cls, acc = "other", 0.0
            for name, share in classes:
                acc += share
                if u_cls < acc:
                    cls = name
                    break
            kind = "done" if k == w.turns - 1 and ends_done else "bash"
            tokens = w.action_tokens * _lognormal_mean1(w.action_spread, z)
            turns.append(SimTurn(tokens, kind, cfg.tool.sample(tool_rng) if kind == "bash" else 0.0,
                                 cfg.world_model.latency(), u_hit < _hit_rate(cfg, cls), cls, prompt,
                                 conf_rng.random()))
            prompt += tokens + cfg.world_model.obs_tokens
        out.append(turns)
    return out


# ---------------------------------------------------------------------------------------------
# A recorded rollout run


def _read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _action_lengths(traj: dict) -> list[int]:
    return [n for _, n in action_spans(traj["policy_mask"])]


@dataclass
class RecordedRun:
    run_dir: str
    sequential: list[dict]
    speculative: list[dict] | None
    trace_seq: list[dict]
    trace_spec: list[dict]
    summary: dict

    @classmethod
    def load(cls, run_dir: str) -> "RecordedRun":
        if not os.path.isdir(run_dir):
            raise SimError(f"{run_dir}: no such run directory")
        paths = {m: os.path.join(run_dir, f"trajectories-{m}.jsonl") for m in ("sequential", "speculative")}
        if not os.path.exists(paths["sequential"]):
            raise SimError(f"{run_dir}: not a rollout run with a sequential half "
                           "(trajectories-sequential.jsonl missing; record it with --mode both)")
        trace = lambda m: (_read_jsonl(p) if os.path.exists(p := os.path.join(run_dir, f"trace-{m}.jsonl")) else [])
        summary = {}
        if os.path.exists(os.path.join(run_dir, "summary.json")):
            with open(os.path.join(run_dir, "summary.json")) as f:
                summary = json.load(f)
        spec = _read_jsonl(paths["speculative"]) if os.path.exists(paths["speculative"]) else None
        return cls(run_dir, _read_jsonl(paths["sequential"]), spec, trace("sequential"), trace("speculative"), summary)

    # -- measured quantities ----------------------------------------------------------------------
    def engine_speed(self) -> tuple[float, float]:
        """(single_tok_s, peak_tok_s) of the step model t0 + t1 * n, fitted by least squares on
        the sequential run's committed generations: seconds per token against the mean number
        of generations running alongside (itself included)."""
        starts, gens = {}, []
        for ev in self.trace_seq:
            if ev["kind"] == "policy_start":
                starts[ev["request_id"]] = ev["t"]
            elif ev["kind"] == "policy_done" and ev["request_id"] in starts and ev.get("tokens", 0) > 0:
                gens.append((starts.pop(ev["request_id"]), ev["t"], ev["tokens"]))
        gens = [g for g in gens if g[1] > g[0]]
        if not gens:
            raise SimError(f"{self.run_dir}: the sequential trace has no timed policy generations")
        xs, ys = [], []
        for a, b, tokens in gens:
            overlap = sum(max(0.0, min(b, d) - max(a, c)) for c, d, _ in gens)
            xs.append(overlap / (b - a))
            ys.append((b - a) / tokens)
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mx) ** 2 for x in xs)
        t1 = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 1e-12 else 0.0
        t1 = min(max(t1, 0.0), my / mx)        # 0 (no contention) .. all of it (processor sharing)
        t0 = max(0.0, my - t1 * mx)
        single = 1.0 / (t0 + t1)
        return single, (1.0 / t1 if t1 > 0 else single * 1e6)

    def concurrency(self) -> int:
        live = best = 0
        for ev in sorted((e for e in self.trace_seq if e["kind"] in ("episode_start", "episode_end")),
                         key=lambda e: (e["t"], e["kind"] == "episode_start")):
            live += 1 if ev["kind"] == "episode_start" else -1
            best = max(best, live)
        return best or len(self.sequential)

    def wm_latency(self) -> dict[tuple[int, int], float]:
        starts, out = {}, {}
        for ev in self.trace_spec:
            if ev["kind"] == "wm_start":
                starts[ev["request_id"]] = ev["t"]
            elif ev["kind"] == "wm_draft" and ev["request_id"] in starts:
                out.setdefault((ev["episode"], ev["turn"]), ev["t"] - starts[ev["request_id"]])
            elif ev["kind"] == "exec_won":
                out.setdefault((ev["episode"], ev["turn"]), math.inf)
        return out

    def outcomes(self) -> dict[tuple[int, int], str]:
        return {(t["episode"], k): turn.get("spec", "") for t in (self.speculative or [])
                for k, turn in enumerate(t["turns"])}

    def class_hit_rates(self) -> dict[str, tuple[int, int]]:
        """command class -> (matches, drafts compared)."""
        out: dict[str, list[int]] = {}
        for t in self.speculative or []:
            for turn in t["turns"]:
                if turn.get("spec") in ("match", "rollback"):
                    c = out.setdefault(command_class(turn["command"], turn.get("observation", "")), [0, 0])
                    c[0] += turn["spec"] == "match"
                    c[1] += 1
        return {k: (a, n) for k, (a, n) in out.items()}

    def differing(self) -> set[int]:
        return set((self.summary.get("comparison") or {}).get("episodes_differing") or [])

    def measured_reduction(self) -> float | None:
        return (self.summary.get("comparison") or {}).get("mean_latency_reduction")

    # -- as simulator input -------------------------------------------------------------------------
    def config(self, base: SimConfig | None = None) -> SimConfig:
        """`base` with the engine, concurrency and hit rates this run measured."""
        base = base or SimConfig()
        single, peak = self.engine_speed()
        rates = self.class_hit_rates()
        hits, n = sum(a for a, _ in rates.values()), sum(b for _, b in rates.values())
        classes = ",".join(f"{k}:{a / b:.4f}" for k, (a, b) in sorted(rates.items()))
        spec = dataclasses.replace(base.spec, hit_rate=hits / n if n else base.spec.hit_rate,
                                   class_hit_rates=classes)
        # A processor-sharing fit means obsspec's hf engine in batch-invariant mode, the one engine
        # that honours request priority (speculation only in idle time); batching engines ignore it.
        priority = "low" if peak < 2 * single else base.engine.spec_priority
        engine = dataclasses.replace(base.engine, single_tok_s=single, peak_tok_s=peak, spec_priority=priority)
        workload = dataclasses.replace(base.workload, episodes=len(self.sequential) - len(self.differing()),
                                       concurrency=self.concurrency())
        return dataclasses.replace(base, engine=engine, spec=spec, workload=workload)

    def workload(self, cfg: SimConfig, resample: frozenset | set = frozenset()) -> list[list[SimTurn]]:
        """The recorded turns; sections named in `resample` ('tool', 'hits', 'world_model') are
        drawn from `cfg` instead of taken from the recording."""
        outcomes, wm = self.outcomes(), self.wm_latency()
        wm_drafted = [v for v in wm.values() if v != math.inf]
        wm_mean = statistics.fmean(wm_drafted) if wm_drafted else cfg.world_model.latency()
        rng, conf_rng = random.Random(cfg.workload.seed), _confidence_draws(cfg.workload.seed)
        out = []
        for traj in self.sequential:
            e, spans, turns = traj["episode"], action_spans(traj["policy_mask"]), []
            if e in self.differing():
                continue  # did other work in the two modes; the measured reduction leaves it out too
            for k, turn in enumerate(traj["turns"]):
                u_hit, tool_rng = rng.random(), random.Random(rng.random())
                cls = command_class(turn.get("command", ""), turn.get("observation", "")) \
                    if turn["kind"] == "bash" else turn["kind"]
                seen = outcomes.get((e, k), "")
                if "hits" not in resample and seen in ("match", "rollback"):
                    hit = seen == "match"
                else:
                    hit = u_hit < _hit_rate(cfg, cls)
                tool = turn.get("tool_sec", 0.0) if "tool" not in resample else cfg.tool.sample(tool_rng)
                w = cfg.world_model.latency() if "world_model" in resample else wm.get((e, k), wm_mean)
                if w == math.inf and "tool" in resample:
                    w = wm_mean  # it lost to the recorded tool, not necessarily to a resampled one
                kind = turn["kind"] if turn["kind"] in ("bash", "done") else "error"
                prompt, tokens = spans[k] if k < len(spans) else (len(traj["policy_mask"]), 1)
                turns.append(SimTurn(float(tokens), kind, tool if kind == "bash" else 0.0, w, hit, cls,
                                     float(prompt), conf_rng.random()))
            out.append(turns)
        return out
