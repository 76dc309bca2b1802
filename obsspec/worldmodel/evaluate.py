"""Exact-hit evaluation of world-model adapters side by side with their base, on held-out steps.

    results = evaluate_models(model, tokenizer, cases, {"base": None, "wm-v3": path},
                              cap=2048, max_tokens=2112)

One engine serves the base and every adapter (loaded by name, as in a rollout). Each draft is
made and judged by `obsspec.models.evaluate.evaluate_world_model`: the rollout's
`WorldModelPredictor` (greedy, stops at the closing tag, capped), then `is_hit`, the scheduler's
own test (normalise, truncate, encode, compare body token ids). There is one code path for "is
this draft a hit"; this module only adds the comparison and the latency ratio.
"""

from __future__ import annotations

import asyncio
from typing import Any

from obsspec.ui.display import Display, NullDisplay


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
    from obsspec.engines.hf import HFEngine
    from obsspec.models.evaluate import evaluate_world_model
    from obsspec.tokens import ChatFormat

    display = display or NullDisplay()
    fmt = ChatFormat(tokenizer)
    results: dict[str, dict] = {}
    async with HFEngine(model, tokenizer, batch_invariant=False, **(hf_options or {})) as engine:
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
