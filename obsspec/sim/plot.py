"""Plots of a simulated grid: a heat map for two axes, lines otherwise (matplotlib, Agg).

    plot_grid(result, "simulate.png")

With the gate simulated (`spec.gate`) the plot shows speculation behind the gate: cells are
coloured and labelled by the gated latency reduction in percent, with the ungated one in
brackets below it; lines are gated (solid) and ungated (dashed). Green cells help, grey are
neutral (within the threshold), red hurt.
"""

from __future__ import annotations

import itertools


def _label(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def plot_grid(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys, rows, th = list(result["grid"]), result["rows"], result["threshold"]
    gated = all(r.get("reduction_gated") is not None for r in rows)
    shown = "reduction_gated" if gated else "reduction"
    if len(keys) == 2:
        xs, ys = result["grid"][keys[0]], result["grid"][keys[1]]
        cell = lambda x, y: next(r for r in rows if r[keys[0]] == x and r[keys[1]] == y)
        z = [[100 * cell(x, y)[shown] for x in xs] for y in ys]
        fig, ax = plt.subplots(figsize=(1.2 * len(xs) + 2.5, (0.8 if gated else 0.6) * len(ys) + 2))
        lim = max(5.0, max(abs(v) for row in z for v in row))
        im = ax.imshow(z, cmap="RdYlGn", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
        for i, y in enumerate(ys):
            for j, x in enumerate(xs):
                v = z[i][j]
                text = f"{v:.1f}" + (f"\n({100 * cell(x, y)['reduction']:.1f})" if gated else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=8,
                        color="black" if abs(v) > 100 * th else "dimgrey")
        ax.set_xticks(range(len(xs)), [_label(x) for x in xs])
        ax.set_yticks(range(len(ys)), [_label(y) for y in ys])
        ax.set_xlabel(keys[0])
        ax.set_ylabel(keys[1])
        fig.colorbar(im, ax=ax, label="latency reduction (%)" + (", gated" if gated else ""))
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        x_key, rest = keys[0], keys[1:]
        xs = result["grid"][x_key]
        for combo in itertools.islice(itertools.product(*(result["grid"][k] for k in rest)), 12):
            sel = [r for r in rows if all(r[k] == v for k, v in zip(rest, combo))]
            at = lambda key: [100 * next(r[key] for r in sel if r[x_key] == x) for x in xs]
            label = ", ".join(f"{k}={_label(v)}" for k, v in zip(rest, combo)) or "simulated"
            line, = ax.plot(range(len(xs)), at(shown), marker="o", label=label + (", gated" if gated else ""))
            if gated:
                ax.plot(range(len(xs)), at("reduction"), ls="--", lw=0.8, color=line.get_color())
        ax.axhspan(-100 * th, 100 * th, color="grey", alpha=0.15, label="neutral band")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(range(len(xs)), [_label(x) for x in xs])
        ax.set_xlabel(x_key)
        ax.set_ylabel("latency reduction (%)")
        ax.legend(fontsize=7)
    src = f" (from {result['from_run']})" if result.get("from_run") else ""
    what = ", speculation gate on (ungated: in brackets)" if gated and len(keys) == 2 else \
        ", gated (ungated dashed)" if gated else ""
    ax.set_title("simulated latency reduction" + what + src, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
