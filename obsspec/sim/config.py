"""What the regime simulator is told: the engine, the world model, the tools, the workload.

    cfg = apply_overrides(SimConfig(), ["tool.median_s=3", "spec.hit_rate=0.6", "engine.peak_tok_s=8000"])

Frozen dataclasses, each field documented once (`doc`); `key=value` overrides are dot-paths with
YAML scalars as values, unknown keys and bad values raise `SimError` (one line, exit code 2 in the
CLI). Defaults: an 8B policy on one H100-class GPU with room for the whole batch, speeds assumed
from public vLLM figures (the `h100-8b` preset's, obsspec/sim/presets.py, which also bounds the
batch by the plan's KV cache): a starting point to override, not a measurement.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import yaml

from obsspec.fields import doc


class SimError(ValueError):
    """A bad simulator parameter or input run (one line, no traceback)."""


def parse_classes(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition(":")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not 0.0 <= out[name.strip()] <= 1.0:
            raise SimError(f"bad class list {text!r}: write name:fraction pairs, e.g. ls:0.9,cat:0.5")
    return out


@dataclass(frozen=True)
class EngineSpec:
    """The shared policy engine. A decode step over n running requests takes t0 + t1 * n seconds
    (t1 = 1 / peak_tok_s, t0 + t1 = 1 / single_tok_s): memory-bound decoding costs the same for
    one request as for a few, compute-bound decoding grows with the batch."""

    single_tok_s: float = doc(130.0, "Tokens/s of one request decoded alone.")
    peak_tok_s: float = doc(5000.0, "Aggregate tokens/s of a saturated engine (>= single_tok_s; "
                                     "equal = a processor-sharing engine like the hf batch-invariant mode).")
    max_batch: int = doc(256, "Requests decoded at once; the rest wait in line.")
    spec_priority: str = doc("equal", "low: speculative requests run only when no committed request "
                                    "does (obsspec's hf engine); equal: they share the batch (vLLM FCFS); "
                                    "priority: committed requests are admitted first, and all admitted "
                                    "share the batch (vLLM --scheduling-policy priority).")
    prefill_tok_s: float = doc(0.0, "Prompt tokens/s of a prefill that runs alone and uninterrupted "
                                    "on admission, as obsspec's hf engine prefills (0 = free: its cost "
                                    "folded into the decode speed, as for vLLM's chunked prefill).")
    prefill_overhead_s: float = doc(0.0, "Fixed seconds of each such prefill.")

    def __post_init__(self) -> None:
        if self.single_tok_s <= 0 or self.peak_tok_s < self.single_tok_s:
            raise SimError("engine.single_tok_s must be > 0 and engine.peak_tok_s >= engine.single_tok_s "
                           f"(got {self.single_tok_s}, {self.peak_tok_s})")
        if self.max_batch < 1:
            raise SimError("engine.max_batch must be >= 1")
        if self.spec_priority not in ("low", "equal", "priority"):
            raise SimError("engine.spec_priority must be low, equal or priority")
        if self.prefill_tok_s < 0 or self.prefill_overhead_s < 0:
            raise SimError("engine.prefill_tok_s and engine.prefill_overhead_s must be >= 0")

    def prefill_sec(self, prompt_tokens: float) -> float:
        if self.prefill_tok_s <= 0:
            return 0.0
        return self.prefill_overhead_s + prompt_tokens / self.prefill_tok_s

    def step_sec(self, n: int) -> float:
        t1 = 1.0 / self.peak_tok_s
        return (1.0 / self.single_tok_s - t1) + t1 * n


@dataclass(frozen=True)
class WorldModelSpec:
    overhead_s: float = doc(0.05, "Fixed cost of one prediction (prefill, queueing), seconds.")
    tok_s: float = doc(300.0, "World-model decode speed per draft (its own GPU share: no contention "
                              "with the policy).")
    obs_tokens: float = doc(120.0, "Mean observation length in tokens (a draft is as long).")

    def __post_init__(self) -> None:
        if self.overhead_s < 0 or self.tok_s <= 0 or self.obs_tokens < 0:
            raise SimError("world_model.overhead_s and obs_tokens must be >= 0 and tok_s > 0")

    def latency(self, obs_tokens: float | None = None) -> float:
        return self.overhead_s + (self.obs_tokens if obs_tokens is None else obs_tokens) / self.tok_s


@dataclass(frozen=True)
class ToolSpec:
    kind: str = doc("lognormal", "lognormal | fixed | uniform: per-command tool latency.")
    median_s: float = doc(3.0, "Median tool latency (lognormal, fixed), seconds.")
    sigma: float = doc(0.5, "Log-normal spread.")
    low_s: float = doc(1.0, "uniform: lowest latency.")
    high_s: float = doc(10.0, "uniform: highest latency.")
    overhead_s: float = doc(0.0, "Added to every command (e.g. the sandbox's own time).")

    def __post_init__(self) -> None:
        if self.kind not in ("lognormal", "fixed", "uniform"):
            raise SimError("tool.kind must be lognormal, fixed or uniform")
        if min(self.median_s, self.sigma, self.low_s, self.overhead_s) < 0 or self.high_s < self.low_s:
            raise SimError("tool latencies must be >= 0 and tool.high_s >= tool.low_s")

    def sample(self, rng) -> float:
        if self.kind == "fixed":
            x = self.median_s
        elif self.kind == "uniform":
            x = rng.uniform(self.low_s, self.high_s)
        else:
            x = self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        return x + self.overhead_s


@dataclass(frozen=True)
class WorkloadSpec:
    episodes: int = doc(32, "Episodes in the batch on this engine (256 per step over 8 GPUs).")
    concurrency: int = doc(0, "Episodes running at once (0 = all).")
    turns: int = doc(16, "Turns per episode: every turn but the last is a bash call.")
    done_frac: float = doc(1.0, "Share of episodes whose last turn is done(); the others end on a "
                                "bash call at the turn limit.")
    action_tokens: float = doc(200.0, "Mean tokens per policy action.")
    action_spread: float = doc(0.5, "Log-normal spread of action lengths (0 = all equal).")
    prompt_tokens: float = doc(0.0, "Tokens of an episode's first prompt; each turn's prompt adds the "
                                    "actions and observations (world_model.obs_tokens) before it. Only "
                                    "prefill (engine.prefill_tok_s) reads it.")
    episode_gap_s: float = doc(0.0, "Seconds between an episode's end and the next one's start at "
                                    "limited concurrency (verifier, sandbox teardown and set-up: not "
                                    "part of any episode's latency, and the engine has one episode fewer).")
    seed: int = doc(0, "Seed of latencies, lengths and hits.")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.turns < 1 or self.concurrency < 0 or self.action_tokens < 1:
            raise SimError("workload.episodes, turns and action_tokens must be >= 1, concurrency >= 0")
        if self.prompt_tokens < 0 or self.episode_gap_s < 0:
            raise SimError("workload.prompt_tokens and workload.episode_gap_s must be >= 0")
        if not 0.0 <= self.done_frac <= 1.0:
            raise SimError("workload.done_frac must be in [0, 1]")


@dataclass(frozen=True)
class SpecSpec:
    enabled: bool = doc(True, "Speculate (the sequential run is always simulated as the baseline).")
    hit_rate: float = doc(0.66, "Probability that a draft arriving before the tool matches exactly.")
    class_hit_rates: str = doc("", "Per command class 'ls:0.9,cat:0.7,...' (overrides hit_rate for "
                                   "those classes; the workload then draws classes by class_mix).")
    class_mix: str = doc("", "Share of commands per class 'ls:0.3,cat:0.2,...' (the rest: other).")
    depth: int = doc(1, "Turns speculated past the committed one.")
    breadth: int = doc(1, "Distinct drafts per prediction, each with its own speculative request.")
    gate: bool = doc(True, "Also simulate speculation behind the gate of obsspec/rollout/gate.py "
                           "(reduction_gated, regime_gated): a draft's speculative request starts only "
                           "when its expected gain is positive; a skipped draft costs no policy compute.")
    gate_cost_share: float = doc(0.25, "The gate's prior committed delay per speculative generation, as a "
                                       "share of a generation's time (gate.py's cost_share), moved by the "
                                       "simulated engine's measured delays per speculative request.")
    confidence_auc: float = doc(0.5, "How well a draft's confidence separates hits from misses, as an "
                                     "AUC in [0.5, 1]: 0.5 = no information, 1 = every hit above every "
                                     "miss. A miss's confidence is uniform on [0, 1], a hit's has CDF "
                                     "x**(auc / (1 - auc)).")

    def __post_init__(self) -> None:
        if not 0.0 <= self.hit_rate <= 1.0:
            raise SimError(f"spec.hit_rate must be in [0, 1] (got {self.hit_rate})")
        if not 0.0 <= self.gate_cost_share < math.inf:
            raise SimError(f"spec.gate_cost_share must be a number >= 0 (got {self.gate_cost_share})")
        if not 0.5 <= self.confidence_auc <= 1.0:
            raise SimError(f"spec.confidence_auc must be in [0.5, 1] (got {self.confidence_auc}; "
                           "0.5 = confidence carries no information)")
        if self.depth < 1 or self.breadth < 1:
            raise SimError("spec.depth and spec.breadth must be >= 1")
        for text in (self.class_hit_rates, self.class_mix):
            parse_classes(text)

    def rates(self) -> dict[str, float]:
        return parse_classes(self.class_hit_rates)

    def confidence(self, u: float, hit: bool) -> float:
        """A draft's confidence from its uniform draw `u`: u for a miss, u ** ((1 - auc) / auc) for
        a hit. P(hit's > miss's) = E[hit's] = auc; one u per draft whatever the hit rate, so
        neighbouring grid points share their draws."""
        if not hit:
            return u
        a = self.confidence_auc
        return 1.0 if a >= 1.0 else u ** ((1.0 - a) / a)


@dataclass(frozen=True)
class SimConfig:
    engine: EngineSpec = doc(EngineSpec(), "The shared policy engine.")
    world_model: WorldModelSpec = doc(WorldModelSpec(), "The world model.")
    tool: ToolSpec = doc(ToolSpec(), "Tool latency.")
    workload: WorkloadSpec = doc(WorkloadSpec(), "The batch of episodes.")
    spec: SpecSpec = doc(SpecSpec(), "Speculation.")


# ---------------------------------------------------------------------------------------------
# key=value overrides


def apply_overrides(cfg, overrides: list[str]):
    """Return `cfg` with each `a.b=value` applied (YAML scalar values), type-checked."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SimError(f"override {item!r} is not key=value")
        cfg = _set(cfg, key.strip().split("."), raw.strip(), key.strip())
    return cfg


def _set(obj, path: list[str], raw: str, full: str):
    names = {f.name: f for f in dataclasses.fields(obj)}
    if path[0] not in names:
        raise SimError(f"unknown simulator key {full!r} (known here: {', '.join(names)})")
    current = getattr(obj, path[0])
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise SimError(f"unknown simulator key {full!r}")
        value = _set(current, path[1:], raw, full)
    else:
        if dataclasses.is_dataclass(current):
            raise SimError(f"{full!r} is a section; set one of its keys ({full}.KEY=VALUE)")
        value = _coerce(yaml.safe_load(raw) if raw else "", type(current), full)
    try:
        return dataclasses.replace(obj, **{path[0]: value})
    except SimError:
        raise
    except (TypeError, ValueError) as e:
        raise SimError(f"{full}: {e}") from None


def _coerce(value, kind: type, key: str):
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):  # YAML reads 1e12 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if kind is str and value is not None and not isinstance(value, (list, dict)):
        return str(value)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise SimError(f"{key}: expected {kind.__name__}, got {value!r}")


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def explain(cfg=None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) for every simulator key, for `obsspec simulate --explain`."""
    cfg = cfg or SimConfig()
    out = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += explain(value, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", repr(value), f.metadata.get("help", "")))
    return out
