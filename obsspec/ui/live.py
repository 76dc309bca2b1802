"""The live rollout dashboard: a consumer of the event stream, redrawn about once a second.

It reads only `SpecMetrics` (itself an event consumer): running episodes with their turn and
phase, and totals — hit rate, exec_won, rollbacks, latency, tokens wasted. `make_live(kind)`
returns a rich dashboard, a plain one (a line every few seconds) or none. A sequential batch
(`start(..., speculative=False)`) shows progress and latency only: it has no speculation to show.
"""

from __future__ import annotations

import sys
import threading

from obsspec.rollout.metrics import SpecMetrics, skips_phrase


def _fmt(v, pct=False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else (f"{v:.3f}" if isinstance(v, float) else str(v))


class RichLive:
    def __init__(self, title: str):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.title = title
        self._live = None
        self.metrics: SpecMetrics | None = None
        self.total = 0
        self.speculative = True

    def start(self, metrics: SpecMetrics, total: int, title: str = "", speculative: bool = True) -> None:
        from rich.live import Live

        self.metrics, self.total, self.speculative = metrics, total, speculative
        self.title = title or self.title
        # transient: the dashboard goes when the batch ends (its last frame, an empty table, stayed
        # above the summary table the command prints next)
        self._live = Live(self._render(), console=self.console, refresh_per_second=1,
                          get_renderable=self._render, transient=True)
        self._live.start()

    def _render(self):
        from rich.table import Table

        m = self.metrics
        s = m.summary() if m else {}
        table = Table(title=f"{self.title}: {s.get('episodes', 0)}/{self.total} episodes done",
                      show_header=True, header_style="bold", expand=False)
        for col in ("episode", "task", "turn", "phase"):
            table.add_column(col)
        running = sorted((m.running if m else {}).items())[:12]
        for ep, info in running:
            table.add_row(str(ep), info["task_id"], str(info["turn"]), info["phase"])
        if m and len(m.running) > 12:
            table.add_row("...", f"{len(m.running) - 12} more", "", "")
        from rich.console import Group
        from rich.text import Text

        latency = f"latency p50 {_fmt(s.get('latency_p50_sec'))}s"
        if not self.speculative:
            return Group(table, Text(latency))
        # Short lines of whole phrases: one long row wrapped mid-phrase on a 150-column terminal.
        busy = f"  {skips_phrase(s)}" if s.get("spec/skipped_frac") else ""
        return Group(table, Text(
            f"hit rate {_fmt(s.get('spec/exact_frac'), True)} (world model {_fmt(s.get('spec/exact_frac_wm'), True)})"
            f"  exec_won {_fmt(s.get('spec/exec_won_frac'), True)}  rollbacks {_fmt(s.get('spec/rollback_frac'), True)}"
            f"{busy}", no_wrap=True, overflow="ellipsis"), Text(
            # speculative generation that ran while tools ran: not a saving (its net is what the
            # paired passes of `obsspec rollout --mode both` and training measure)
            f"{latency}  spec overlap {s.get('spec/overlap_sec', 0.0):.1f}s (not a saving)"
            f"  tokens wasted {s.get('spec/policy_tokens_discarded', 0)}", no_wrap=True, overflow="ellipsis"))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class PlainLive:
    """A status line every few seconds (for logs and CI), from a background thread."""

    def __init__(self, title: str, every_s: float = 5.0):
        self.title, self.every_s = title, every_s
        self.metrics, self.total, self.speculative = None, 0, True
        self._stop = threading.Event()
        self._thread = None

    def start(self, metrics: SpecMetrics, total: int, title: str = "", speculative: bool = True) -> None:
        self.metrics, self.total, self.speculative = metrics, total, speculative
        self.title = title or self.title
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._line()

    def _line(self) -> None:
        s = self.metrics.summary()
        line = f"{self.title}: {s['episodes']}/{self.total} episodes"
        if self.speculative:
            busy = f"{skips_phrase(s)}, " if s["spec/skipped_frac"] else ""
            line += (f", hit rate {_fmt(s['spec/exact_frac'], True)} (world model {_fmt(s['spec/exact_frac_wm'], True)}), "
                     f"exec_won {_fmt(s['spec/exec_won_frac'], True)}, rollbacks {_fmt(s['spec/rollback_frac'], True)}, "
                     f"{busy}spec overlap {s['spec/overlap_sec']:.1f}s (not a saving)")
        print(line, file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._line()


class NoLive:
    def __init__(self, title: str = ""):
        pass

    def start(self, metrics: SpecMetrics, total: int, title: str = "", speculative: bool = True) -> None:
        pass

    def stop(self) -> None:
        pass


def make_live(kind: str, title: str = "rollout"):
    if kind not in ("auto", "rich", "plain", "none"):
        raise ValueError(f"display must be auto, rich, plain or none, not {kind!r}")
    if kind == "auto":
        kind = "rich" if sys.stderr.isatty() else "plain"
    return {"rich": RichLive, "plain": PlainLive, "none": NoLive}[kind](title)
