"""Tables people read at the end of a command (rich), from a command's summary dict.

Without a terminal (CI logs, `| tee`) rich renders 80 columns: labels never wrap and stay within
LABEL_WIDTH, so the values keep the rest of the line and no label breaks mid-phrase.
"""

from __future__ import annotations

from collections import Counter

LABEL_WIDTH = 44  # 80 columns less a two-column table's borders and padding (7) and ~29 for values


def cell(v, pct: bool = False) -> str:
    """One value as a table shows it (the terminal tables and the HTML report alike)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if pct:
        return f"{100 * v:.1f}%"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


ROWS = [  # (label, key, as percentage)
    ("episodes", "episodes", False),
    ("latency p50 (s)", "latency_p50_sec", False),
    ("latency p95 (s)", "latency_p95_sec", False),
    ("latency mean (s)", "latency_mean_sec", False),
    ("reward mean", "reward_mean", False),
    ("hit rate (spec/exact_frac)", "spec/exact_frac", True),
    ("  world model's own drafts", "spec/exact_frac_wm", True),
    ("  history cache / replay", "spec/exact_frac_cache", True),
    ("  sibling episodes' results", "spec/exact_frac_sibling", True),
    ("exec_won", "spec/exec_won_frac", True),
    ("rollbacks", "spec/rollback_frac", True),
    ("speculation skipped", "spec/skipped_frac", True),
    ("  engine busy (commands)", "spec/skipped_busy", False),
    ("  gate: expected gain <= 0 (drafts)", "spec/skipped_low_gain", False),
    ("  gate: tool expected done (drafts)", "spec/skipped_no_time", False),
    ("  gate: world model not worth asking", "spec/skipped_wm_cost", False),
    ("committed work delayed by speculation", "committed_delay_frac", True),
    ("arrived, all drafts unusable", "spec/unusable_frac", True),
    ("drafts unusable (never closed)", "spec/wm_drafts_unusable", False),
    ("world-model prompts too long (no draft)", "spec/wm_prompt_too_long", False),
    ("draft time, mean (s)", "spec/wm_sec_mean", False),
    ("tool time, mean (s)", "tool_sec_mean", False),
    ("tool / draft time", "spec/wm_tool_ratio", False),
    ("overlap (s)", "spec/overlap_sec", False),
    ("blocked on speculation (s)", "spec/block_sec", False),
    ("policy tokens wasted", "spec/policy_tokens_discarded", False),
    ("infra failures", "infra_failures", False),
]


def print_rollout_table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    modes = summary["modes"]
    title = "rollout" + (" (EMULATED tool latency)" if summary["tool_latency"]["emulated"] else "")
    if summary.get("replay_of"):
        title = f"replay of {summary['replay_of']} (recorded observations and tool latencies)"
    predictor = modes.get("speculative", {}).get("predictor")
    table = Table(title=title + (f", predictor: {predictor}" if predictor else ""))
    table.add_column("", no_wrap=True)
    for m in modes:
        table.add_column(m, justify="right")
    for label, key, pct in ROWS:
        table.add_row(label, *(cell(modes[m].get(key), pct) for m in modes))
    console = Console()
    console.print(table)
    comp = summary.get("comparison")
    if comp:
        console.print(headline(comp))
        console.print(f"token-identical: {cell(comp['token_identical'])}")
        if comp["episodes_differing"]:
            console.print(f"episodes differing first in a tool observation (the tool printed something "
                          f"else): {comp['differing_first_in_observation']}; first in a policy action: "
                          f"{comp['differing_first_in_action']}")


def headline(comp: dict) -> str:
    """The measured reduction as a user should read it: per pair, its interval, and whether the
    interval excludes 0 (rollout.pairs alternating pairs)."""
    mean, half = comp.get("mean_latency_reduction"), comp.get("reduction_ci95")
    text = f"mean latency reduction: {cell(mean, True)}"
    if half is not None:
        text += f" ± {100 * half:.1f} (95 % interval over {comp['pairs']} alternating pairs: " \
                f"{', '.join(f'{100 * r:+.1f}%' for r in comp['reduction_per_pair'])})"
    if comp.get("verdict"):
        text += f": {comp['verdict']}"
    return text + f" (over {comp['episodes_compared_for_latency']} token-identical episodes)"


def _few(by_kind: dict, most: int = 10) -> dict:
    """Per-kind rows only while they fit a terminal table (all of them are in summary.json)."""
    return by_kind if len(by_kind) <= most else {}


def _grouped(heading: str, by_kind: dict) -> list[tuple[str, str]]:
    """A heading row, then one row per kind indented under it (its name alone: labels stay short)."""
    indent = " " * (len(heading) - len(heading.lstrip()) + 2)
    rows = [(indent + kind, f"{cell(a, True)} → {cell(b, True)}") for kind, (a, b) in _few(by_kind).items()]
    return [(heading, "")] + rows if rows else []


def _val_by_family(ev: dict) -> dict:
    """family -> [val success before, after] from the evaluations' "family/kind" counts."""
    def by_family(result: dict) -> dict:
        won, scored = Counter(), Counter()
        for key, (w, n) in (result.get("success_by_kind") or {}).items():
            won[key.split("/")[0]] += w
            scored[key.split("/")[0]] += n
        return {f: won[f] / scored[f] for f in scored if scored[f]}

    before, after = by_family(ev.get("before", {})), by_family(ev.get("after", {}))
    return {f: [before.get(f), after.get(f)] for f in sorted(set(before) | set(after))}


def _gain(interval: dict | None) -> str:
    if not interval:
        return "-"
    half = interval.get("ci95")
    return f"{100 * interval['mean']:+.1f} points" + (f" ± {100 * half:.1f}" if half is not None else "") + \
        f" ({interval.get('tasks', len(interval.get('runs', [])))} tasks)"


def _reduction(interval: dict | None) -> str:
    if not interval:
        return "-"
    half = interval.get("ci95")
    return f"{100 * interval['mean']:+.1f} %" + (f" ± {100 * half:.1f}" if half is not None else "")  # (positive: saved)


def _counts(pairs) -> str:
    """`name:count, ...`: a value that wraps between items, never inside one."""
    return ", ".join(f"{name}:{n}" for name, n in pairs) or "-"


def _paired_rows(p: dict) -> list[tuple[str, str]]:
    """Measured: each step's episodes ran speculatively and sequentially on the same seeds."""
    return [
        ("rollout time saved, measured (95 %)", _reduction(p.get("rollout_reduction"))),
        ("  paired steps", str(p["steps"])),
        ("  episode latency (token-identical ones)", _reduction(p.get("latency_reduction"))),
        ("  seconds, speculative / sequential", f"{p['spec_sec']:.0f} / {p['seq_sec']:.0f}"),
        ("  episodes differing (in an action; tokens)",
         f"{p['episodes_differing']} ({p['episodes_differing_in_action']}; {p['tokens_differing']})"),
    ]


def print_training_table(summary: dict, latency) -> None:
    """The end of `obsspec train` (and the demo): reward over the run, val before/after, speculation."""
    from rich.console import Console
    from rich.table import Table

    ev = summary.get("eval", {})
    emulated = getattr(latency, "kind", "none") != "none"
    paired = summary.get("paired")
    table = Table(title=f"training: {summary.get('steps')} steps" +
                  (" (tool latency includes EMULATED remote latency)" if emulated else ""),
                  # overlapped generation leaves out what the world model's own compute slows down,
                  # which on a shared CPU can outweigh it (docs/WORLDMODEL.md)
                  caption=None if paired else "time hidden: an estimate; train.measure_speculation=true "
                                              "measures it")
    table.add_column("", no_wrap=True)
    table.add_column("value", justify="right")
    rows = [
        ("mean reward, first third of the steps", cell(summary.get("reward_first_third"))),
        ("mean reward, last third of the steps", cell(summary.get("reward_last_third"))),
        *_grouped("success, first → last third", summary.get("success_by_kind") or {}),
        ("val success before training", cell(ev.get("before", {}).get("success_frac"), True)),
        ("val success after training", cell(ev.get("after", {}).get("success_frac"), True)),
        ("  change, task by task (95 % interval)", _gain(summary.get("val_gain"))),
        *_grouped("  val success by family, before → after", _val_by_family(ev)),
        ("hit rate (mean over steps)", cell(summary.get("hit_rate_mean"), True)),
        # the cache answers what a group member already saw: it must not hide the world model's own
        ("  world model's own drafts (hits, mean rate)",
         f"{cell(summary.get('wm_hits'))}, {cell(summary.get('wm_hit_rate_mean'), True)}"),
        ("    by command class (hits/compared)",
         _counts((c, f"{h}/{n}") for c, (h, n) in (summary.get("wm_class_hits") or {}).items())),
        ("  history cache (hits, mean rate)",
         f"{cell(summary.get('cache_hits'))}, {cell(summary.get('cache_hit_rate_mean'), True)}"),
        ("  sibling episodes' results (hits)", cell(summary.get("sibling_hits"))),
        ("speculation skipped (mean share; by reason)",
         f"{cell(summary.get('skipped_frac_mean'), True)}; {_counts((summary.get('skips') or {}).items())}"),
        ("committed work delayed (worst step)", cell(summary.get("committed_delay_frac_max"), True)),
        # (only a paired measurement says what speculation saved: without one, its overlap with the
        # tools is shown for what it is, an upper bound)
        *(_paired_rows(paired) if paired else [
            ("spec overlap with tools (s, not a saving)", cell(summary.get("latency_saved_sec")))]),
        ("world-model adapter versions", cell(summary.get("wm_version"))),
        ("infra failures (excluded)", cell(summary.get("infra_failures"))),
        ("run directory", str(summary.get("out_dir"))),
    ]
    for label, value in rows:
        table.add_row(label, value)
    Console().print(table)
