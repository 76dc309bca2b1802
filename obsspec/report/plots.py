"""The report's PNG plots (matplotlib, Agg). Each takes a `RunData` and a path, draws one figure,
and returns a one-line caption, or None when the run has nothing to show for it."""

from __future__ import annotations

from collections import Counter

from obsspec.rollout.metrics import mean_of, pooled_success

COLORS = {"generation": "#4c72b0", "tool": "#dd8452", "blocked": "#c44e52", "other": "#bbbbbb",
          "world_model": "#8172b3", "overlap": "#55a868"}
LANES = ["policy", "tool", "world model", "speculative"]
MAX_BARS = 64  # per-episode bar charts show at most this many episodes (the first ones)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _plt().close(fig)


def _top_classes(counter: Counter, n: int = 6) -> list[str]:
    return [c for c, _ in counter.most_common(n)]


# ---------------------------------------------------------------------------------------------


def hit_rate(run, path: str) -> str | None:
    """Training: hit rate per step, overall and per command class. Rollout: cumulative over the run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    if run.kind == "training":
        steps = [r["step"] for r in run.steps]
        ax.plot(steps, [r["spec/exact_frac"] for r in run.steps], color="black", lw=2, marker="o", label="all")
        for key, ls in (("spec/exec_won_frac", ":"), ("spec/rollback_frac", "--")):
            if any(key in r for r in run.steps):
                ax.plot(steps, [r.get(key) for r in run.steps], color="grey", ls=ls, label=key.split("/")[1])
        totals = Counter()
        for r in run.steps:
            for c, (_, n) in (r.get("spec/class_hits") or {}).items():
                totals[c] += n
        for c in _top_classes(totals):
            xs = [(r["step"], r["spec/class_hits"][c]) for r in run.steps if c in (r.get("spec/class_hits") or {})]
            ax.plot([s for s, _ in xs], [m / n if n else None for _, (m, n) in xs], lw=1, marker=".", label=c)
        ax.set_xlabel("training step")
        caption = "Hit rate (exact matches over drafts that arrived before the tool) per training step, overall and per command class."
    else:
        events = run.hits_over_time(run.main_mode)
        if not events:
            plt.close(fig)
            return None
        def cumulative(evs):
            hits, xs, ys = 0, [], []
            for i, (t, _, m) in enumerate(evs, 1):
                hits += m
                xs.append(t)
                ys.append(hits / i)
            return xs, ys
        ax.plot(*cumulative(events), color="black", lw=2, label="all")
        for c in _top_classes(Counter(c for _, c, _ in events)):
            ax.plot(*cumulative([x for x in events if x[1] == c]), lw=1, label=c)
        ax.set_xlabel("time in the run (s)")
        caption = ("Cumulative hit rate over the rollout, overall and per command class (first word of the "
                   "command). A rollout has no training steps; a training run shows one point per step.")
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("hit rate")
    ax.legend(fontsize=7, ncol=2)
    _save(fig, path)
    return caption


def reward(run, path: str, window: int = 8) -> str | None:
    """Training: the reward per step with its moving mean, and success per question kind over the
    same trailing window (which kinds the run learned, and which it unlearned)."""
    rewards = [r.get("reward") for r in run.steps] if run.kind == "training" else []
    if not any(v is not None for v in rewards):
        return None
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    steps = [r["step"] for r in run.steps]
    a.plot(steps, rewards, color="grey", marker=".", lw=1, label="per step")
    a.plot(steps, [mean_of(rewards[max(0, i + 1 - window):i + 1]) for i in range(len(rewards))],
           color="black", lw=2, label=f"mean of the last {window} steps")
    val = _val_points(run.summary, steps[-1])
    for (x, y), label, marker in zip(val, ("val success before", "val success after"), ("s", "D")):
        a.plot([x], [y], marker=marker, ms=7, ls="none", color="tab:blue", label=label)
    a.set(xlabel="training step", ylabel="reward", ylim=(-0.03, 1.03))
    a.legend(fontsize=7)
    kinds = sorted({k for r in run.steps for k in (r.get("success_by_kind") or {})})
    windows = [pooled_success(run.steps[max(0, i + 1 - window):i + 1]) for i in range(len(run.steps))]
    for kind in kinds[:10]:
        b.plot(steps, [w.get(kind) for w in windows], lw=1.5, label=kind)
    b.set(xlabel="training step", ylabel=f"success (last {window} steps)", ylim=(-0.03, 1.03))
    if kinds:
        b.legend(fontsize=7, ncol=2)
    _save(fig, path)
    gain = (run.summary or {}).get("val_gain") or {}
    half = gain.get("ci95")
    val_text = (f"; val success before (step 0) and after training: {100 * gain['mean']:+.1f} points"
                + (f" ± {100 * half:.1f} (95 % interval over {gain.get('tasks')} tasks, same seeds)" if half else "")
                if val and gain.get("mean") is not None else "")
    return (f"Training reward per step and its mean over the last {window} steps{val_text}; right: success per "
            f"question kind (`family/kind`) over the same window: {len(kinds)} kinds"
            + (", the first 10 drawn." if len(kinds) > 10 else "."))


def _val_points(summary: dict | None, last_step: int) -> list[tuple[int, float]]:
    """(step, val success) before and after training, where the run measured both."""
    evals = (summary or {}).get("eval") or {}
    fracs = [(evals.get(k) or {}).get("success_frac") for k in ("before", "after")]
    return [(0, fracs[0]), (last_step, fracs[1])] if None not in fracs else []


def latency_breakdown(run, path: str) -> str | None:
    mode = run.main_mode
    parts = run.breakdown(mode)
    if not parts:
        return None
    shown = f" (first {MAX_BARS} of {len(parts)} episodes)" if len(parts) > MAX_BARS else ""
    parts = parts[:MAX_BARS]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 0.28 * len(parts) + 2), 3.8))
    xs = list(range(len(parts)))
    bottom = [0.0] * len(parts)
    for name in ("generation", "tool", "blocked", "other"):
        ys = [getattr(p, name) for p in parts]
        ax.bar(xs, ys, bottom=bottom, width=0.7, color=COLORS[name], label=name)
        bottom = [b + y for b, y in zip(bottom, ys)]
    for name, off in (("world_model", -0.3), ("overlap", 0.3)):
        ax.bar([x + off for x in xs], [getattr(p, name) for p in parts], width=0.18, color=COLORS[name],
               label=f"{name.replace('_', ' ')} (hidden)")
    seq = run.latencies("sequential") if mode == "speculative" else {}
    if seq:
        ax.scatter([x for x, p in zip(xs, parts) if p.episode in seq], [seq[p.episode] for p in parts if p.episode in seq],
                   marker="_", s=120, color="black", label="sequential latency", zorder=3)
    ax.set_xticks(xs, [str(p.episode) for p in parts], fontsize=6)
    ax.set_xlabel("episode")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, ncol=3)
    _save(fig, path)
    return (f"Latency per trajectory ({mode}){shown}: committed generation + tool + blocked on a matched speculation + "
            "other (sandbox start, scheduling) stack to the episode's latency; thin bars are work hidden behind the "
            "tool (world model, kept speculative generation). Black ticks: the same episode run sequentially.")


def timeline(run, path: str, n: int = 4) -> str | None:
    mode = run.main_mode
    episodes = sorted({ev["episode"] for ev in run.traces.get(mode, []) if ev["episode"] >= 0})[:n]
    spans = run.timeline(mode, episodes)
    if not any(spans.values()):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(episodes) + 1.2))
    color = {"committed": "#55a868", "cancelled": "#c44e52", "failed": "black"}
    marks = {"match": ("v", "#2ca02c"), "rollback": ("x", "#d62728"), "exec_won": ("|", "#7f7f7f")}
    labels, y0 = [], 0
    for e in episodes:
        for i, lane in enumerate(LANES):
            y = y0 + i
            labels.append((y, f"ep {e} {lane}"))
            for ln, t0, t1, outcome in spans[e]:
                if ln != lane:
                    continue
                c = COLORS["generation"] if lane == "policy" else COLORS["tool"] if lane == "tool" else \
                    COLORS["world_model"] if lane == "world model" else color.get(outcome.split(" ")[0], "grey")
                waiting = outcome.endswith("(waiting)")
                ax.barh(y, max(t1 - t0, 1e-3), left=t0, height=0.3 if waiting else 0.7, color=c,
                        alpha=0.45 if waiting else 1.0, edgecolor="white", lw=0.3)
        for ln, t, _, kind in spans[e]:
            if ln == "event":
                m, c = marks[kind]
                ax.scatter([t], [y0 + 1], marker=m, color=c, s=40, zorder=3)
        y0 += len(LANES) + 1
    ax.set_yticks([y for y, _ in labels], [s for _, s in labels], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time in the run (s)")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="#55a868", label="speculation kept"), Patch(color="#c44e52", label="speculation cancelled"),
                       *(Line2D([], [], marker=m, color=c, ls="", label=k) for k, (m, c) in marks.items())],
              fontsize=7, loc="upper right")
    _save(fig, path)
    return (f"Timeline of episodes {episodes} ({mode}): committed generation, tool, world-model prediction, and "
            "speculative generations (green kept, red cancelled; thin and pale once computed, while they wait for "
            "the tool to decide); markers at match, rollback and exec_won.")


def wasted_tokens(run, path: str) -> str | None:
    wasted, wm = run.wasted_tokens(run.main_mode), run.wm_tokens_unmatched(run.main_mode)
    if not wasted and not any(wm.values()):
        return None
    plt = _plt()
    eps = sorted(set(wasted) | set(wm))
    shown = f" (first {MAX_BARS} of {len(eps)} episodes)" if len(eps) > MAX_BARS else ""
    eps = eps[:MAX_BARS]
    reasons = sorted({r for d in wasted.values() for r in d})
    fig, ax = plt.subplots(figsize=(max(6, 0.28 * len(eps) + 2), 3.4))
    xs = list(range(len(eps)))
    bottom = [0] * len(eps)
    for reason in reasons:
        ys = [wasted.get(e, {}).get(reason, 0) for e in eps]
        ax.bar([x - 0.18 for x in xs], ys, width=0.36, bottom=bottom, label=f"policy: {reason}")
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.bar([x + 0.18 for x in xs], [wm.get(e, 0) for e in eps], width=0.36, color=COLORS["world_model"],
           hatch="//", label="world model: drafts not kept")
    ax.set_xticks(xs, [str(e) for e in eps], fontsize=6)
    ax.set_xlabel("episode")
    ax.set_ylabel("tokens wasted")
    ax.legend(fontsize=7)
    _save(fig, path)
    return (f"Tokens computed and thrown away per episode{shown}: speculative policy tokens by why they were cancelled "
            f"(total {sum(sum(d.values()) for d in wasted.values())}), and world-model tokens of drafts that were "
            f"not kept (total {sum(wm.values())}).")


def spec_vs_seq(run, path: str) -> str | None:
    seq, spec = run.latencies("sequential"), run.latencies("speculative")
    common = sorted(set(seq) & set(spec))
    if not common:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.6, 4.4))
    ax.scatter([seq[e] for e in common], [spec[e] for e in common], s=16)
    hi = max(max(seq[e], spec[e]) for e in common) * 1.05
    ax.plot([0, hi], [0, hi], color="grey", lw=0.8, label="no change")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("sequential latency (s)")
    ax.set_ylabel("speculative latency (s)")
    total = 1 - sum(spec[e] for e in common) / sum(seq[e] for e in common)
    ax.set_title(f"{len(common)} episodes, first pair: total latency {100 * total:+.1f} % reduction "
                 f"(the summary gives the interval over pairs)", fontsize=8)
    ax.legend(fontsize=7)
    _save(fig, path)
    return ("Each episode's speculative latency against its sequential latency (below the line: faster). "
            "Episodes that were not token-identical are included here; the summary's reduction counts only identical ones.")


def calibration(run, path: str) -> str | None:
    """The gate's predicted hit probability against the observed hit rate, per bin: the
    speculative run's `calibration` table (SpecMetrics, from every draft compared with the real
    output)."""
    rows = ((run.summary.get("modes") or {}).get("speculative") or {}).get("calibration")
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.6, 4.4))
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, label="calibrated")
    ax.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", color="black", label="observed")
    for predicted, observed, n in rows:
        ax.annotate(str(n), (predicted, observed), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted hit probability (gate)")
    ax.set_ylabel("observed hit rate")
    ax.legend(fontsize=7)
    _save(fig, path)
    return (f"Calibration of the speculation gate over {sum(r[2] for r in rows)} drafts compared with the real output: "
            f"per bin of predicted probability, its mean against the observed hit rate (labels: drafts per bin).")
