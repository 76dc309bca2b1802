"""Plots of a simulated grid: a heat map for two axes, lines otherwise (matplotlib, Agg).

    plot_grid(result, "simulate.png")

Green cells help, grey are neutral (within the threshold), red hurt; every cell is labelled
with its latency reduction in percent.
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
    if len(keys) == 2:
        xs, ys = result["grid"][keys[0]], result["grid"][keys[1]]
        z = [[next(r["reduction"] for r in rows if r[keys[0]] == x and r[keys[1]] == y) * 100 for x in xs] for y in ys]
        fig, ax = plt.subplots(figsize=(1.2 * len(xs) + 2.5, 0.6 * len(ys) + 2))
        lim = max(5.0, max(abs(v) for row in z for v in row))
        im = ax.imshow(z, cmap="RdYlGn", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
        for i, row in enumerate(z):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8,
                        color="black" if abs(v) > 100 * th else "dimgrey")
        ax.set_xticks(range(len(xs)), [_label(x) for x in xs])
        ax.set_yticks(range(len(ys)), [_label(y) for y in ys])
        ax.set_xlabel(keys[0])
        ax.set_ylabel(keys[1])
        fig.colorbar(im, ax=ax, label="latency reduction (%)")
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        x_key, rest = keys[0], keys[1:]
        xs = result["grid"][x_key]
        for combo in itertools.islice(itertools.product(*(result["grid"][k] for k in rest)), 12):
            sel = [r for r in rows if all(r[k] == v for k, v in zip(rest, combo))]
            ys = [100 * next(r["reduction"] for r in sel if r[x_key] == x) for x in xs]
            label = ", ".join(f"{k}={_label(v)}" for k, v in zip(rest, combo)) or "simulated"
            ax.plot(range(len(xs)), ys, marker="o", label=label)
        ax.axhspan(-100 * th, 100 * th, color="grey", alpha=0.15, label="neutral band")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(range(len(xs)), [_label(x) for x in xs])
        ax.set_xlabel(x_key)
        ax.set_ylabel("latency reduction (%)")
        ax.legend(fontsize=7)
    src = f" (from {result['from_run']})" if result.get("from_run") else ""
    ax.set_title("simulated latency reduction" + src, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
