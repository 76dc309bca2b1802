"""Exact-hit evaluation of a world model, and of its adapters side by side with their base.

    figures = await evaluate_world_model(engine, fmt, cases, cap=2048, max_tokens=2112)
    results = evaluate_models(model, tokenizer, cases, {"base": None, "wm-v3": path},
                              cap=2048, max_tokens=2112)

Cases come from obsspec/worldmodel/cases.py. Each draft is made by the rollout's
`WorldModelPredictor` (greedy, stops at the closing tag, capped) and judged by
`ChatFormat.draft_hits`, the scheduler's own test (normalise, truncate, encode, compare body
token ids): one code path for "is this draft a hit". Figures overall and per command class
(obsspec/commands.py), with the unusable-draft rate and draft latency. `evaluate_models` serves
the base and every adapter from one engine (loaded by name, as in a rollout).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import defaultdict
from typing import Any

from obsspec.commands import command_class
from obsspec.progress import Display, NullDisplay
from obsspec.rollout.predictors import PredictRequest, WorldModelPredictor
from obsspec.tokens import ChatFormat
from obsspec.worldmodel.cases import WMCase


def _frac(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


async def evaluate_world_model(engine, fmt: ChatFormat, cases: list[WMCase], cap: int,
                               max_tokens: int, *, concurrency: int = 4,
                               display: Display | None = None, label: str = "world model drafts",
                               adapter: str | None = None) -> dict:
    """Greedy drafts for `cases` (with LoRA adapter `adapter` loaded on the engine, or the base);
    exact-hit and unusable rates overall and per command class."""
    display = display or NullDisplay()
    predictor = WorldModelPredictor(engine, fmt, cap=cap, max_tokens=max_tokens, adapter=adapter)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, case: WMCase) -> tuple[bool, bool, float]:
        async with gate:
            t0 = time.monotonic()
            (draft,) = await predictor.predict(PredictRequest("", "", i, 0, (case.command,), case.prompt_ids))
            sec = time.monotonic() - t0
        display.advance(1)
        return draft.body is None, fmt.draft_hits(draft.body, case.body, cap), sec

    display.start(len(cases), label)
    try:
        results = await asyncio.gather(*(one(i, c) for i, c in enumerate(cases)))
    finally:
        display.finish()
    by_class: dict[str, list[bool]] = defaultdict(list)
    sec_by_class: dict[str, list[float]] = defaultdict(list)
    for case, (_, hit, sec) in zip(cases, results):
        by_class[command_class(case.command, case.body)].append(hit)
        sec_by_class[command_class(case.command, case.body)].append(sec)
    tool = [c.tool_sec for c in cases if c.tool_sec > 0]
    draft_sec = statistics.fmean(r[2] for r in results) if results else None
    return {
        "steps": len(cases), "exact_frac": _frac(sum(r[1] for r in results), len(results)),
        "unusable_frac": _frac(sum(r[0] for r in results), len(results)),
        "per_class": {k: {"steps": len(v), "exact_frac": _frac(sum(v), len(v))}
                      for k, v in sorted(by_class.items())},
        "per_class_draft_sec_mean": {k: round(statistics.fmean(v), 4) for k, v in sorted(sec_by_class.items())},
        "classes_with_output_hit": sorted(k for k, v in by_class.items()
                                          if k not in ("no_output",) and any(v)),
        "draft_sec_mean": round(draft_sec, 4) if draft_sec is not None else None,
        "draft_concurrency": concurrency,
        "tool_sec_mean": round(statistics.fmean(tool), 4) if tool else None,
    }




def with_latency_ratio(result: dict) -> dict:
    """`tool_over_draft`: how many times faster than the tool the drafts were (mean over mean,
    same steps; None when the steps carry no recorded tool latency, e.g. reference rows)."""
    draft, tool = result.get("draft_sec_mean"), result.get("tool_sec_mean")
    return {**result, "tool_over_draft": round(tool / draft, 2) if draft and tool else None}


async def evaluate_models_async(model: Any, tokenizer: Any, cases: list, adapters: dict[str, str | None],
                                *, cap: int, max_tokens: int, concurrency: int = 4,
                                display: Display | None = None, hf_options: dict | None = None) -> dict[str, dict]:
    """label -> figures, for each label's adapter folder (None: the bare base); `hf_options`:
    the recipe's `world_model.hf_options`, so drafts are decoded as in the rollout."""
    from obsspec.engines.hf import fast_engine

    display = display or NullDisplay()
    fmt = ChatFormat(tokenizer)
    results: dict[str, dict] = {}
    async with fast_engine(model, tokenizer, **(hf_options or {})) as engine:
        for label, path in adapters.items():
            name = None
            if path is not None:
                name = f"eval-{label}"
                await engine.load_adapter(name, path)
            results[label] = with_latency_ratio(await evaluate_world_model(
                engine, fmt, cases, cap, max_tokens, concurrency=concurrency, display=display,
                label=f"drafts: {label}", adapter=name))
            if name is not None:
                await engine.unload_adapter(name)
    return results


def evaluate_models(*args, **kwargs) -> dict[str, dict]:
    return asyncio.run(evaluate_models_async(*args, **kwargs))


def gain(base: dict, adapter: dict) -> dict:
    """Exact-match points the adapter gains over the base, overall and per command class."""
    def points(a, b):
        return None if a is None or b is None else round(100 * (b - a), 1)

    return {"exact_points": points(base["exact_frac"], adapter["exact_frac"]),
            "per_class_points": {k: points(v["exact_frac"], adapter["per_class"].get(k, {}).get("exact_frac"))
                                 for k, v in base["per_class"].items()}}


def table(summary: dict) -> str:
    """The final table of a train-worldmodel run: one row per model on the held-out steps."""
    ev = summary.get("eval", {})
    models = ev.get("models", {})
    lines = [f"held-out: {ev.get('steps', 0)} steps of {ev.get('held_out_tasks', 0)} tasks; "
             f"determinism ceiling {ev.get('determinism_ceiling')}"]
    classes = sorted({k for r in models.values() for k in r["per_class"]})
    lines.append(f"{'model':12} {'exact':>6} {'unusable':>8} {'draft_s':>8} {'tool/draft':>10}  "
                 + " ".join(f"{c:>9}" for c in classes))
    for label, r in models.items():
        cells = " ".join(f"{_pct(r['per_class'].get(c, {}).get('exact_frac')):>9}" for c in classes)
        lines.append(f"{label:12} {_pct(r['exact_frac']):>6} {_pct(r['unusable_frac']):>8} "
                     f"{r['draft_sec_mean'] or 0:>8.3f} {r['tool_over_draft'] or '-':>10}  {cells}")
    if "gain" in ev:
        lines.append(f"adapter gain over base: {ev['gain']['exact_points']} points exact match")
    if "train" in summary:
        t = summary["train"]
        lines.append(f"trained {t['steps']} steps on {t['examples']} examples in {t['train_sec']}s; "
                     f"adapter {summary['adapter']['path']} ({t['adapter_bytes'] / 1024:.0f} KiB)")
    return "\n".join(lines)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
