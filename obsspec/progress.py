"""Progress displays: how long-running library code reports progress without importing rich.

Library code takes a `Display` and calls `start(total, label)`, `advance(n)`, `log(msg)` and
`finish()`. The CLI picks one: `RichDisplay` (a live progress bar, redrawn about once a second),
`PlainDisplay` (a line per 10%, for logs and CI) or `NullDisplay` (silent, for tests).
"""

from __future__ import annotations

import sys
import time
from typing import Protocol


class Display(Protocol):
    def start(self, total: int, label: str) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def log(self, message: str) -> None: ...
    def finish(self) -> None: ...


class NullDisplay:
    def start(self, total: int, label: str) -> None: pass
    def advance(self, n: int = 1) -> None: pass
    def log(self, message: str) -> None: pass
    def finish(self) -> None: pass


class PlainDisplay:
    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.total = self.done = self.next_report = 0
        self.label = ""
        self.t0 = 0.0

    def start(self, total: int, label: str) -> None:
        self.total, self.done, self.label, self.t0 = total, 0, label, time.monotonic()
        self.next_report = max(1, total // 10)
        print(f"{label}: 0/{total}", file=self.stream, flush=True)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.done >= self.next_report or self.done == self.total:
            self.next_report += max(1, self.total // 10)
            print(f"{self.label}: {self.done}/{self.total} ({time.monotonic() - self.t0:.1f}s)",
                  file=self.stream, flush=True)

    def log(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    def finish(self) -> None:
        pass


class RichDisplay:
    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.console = Console(stderr=True)
        self._columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
        self._progress_cls = Progress
        self._progress = None
        self._task = None

    def start(self, total: int, label: str) -> None:
        self.finish()
        self._progress = self._progress_cls(*self._columns, console=self.console, refresh_per_second=1)
        self._progress.start()
        self._task = self._progress.add_task(label, total=total)

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def log(self, message: str) -> None:
        self.console.print(message)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def make_display(kind: str) -> Display:
    """'rich' (default on a terminal), 'plain' or 'none'."""
    if kind == "auto":
        kind = "rich" if sys.stderr.isatty() else "plain"
    return {"rich": RichDisplay, "plain": PlainDisplay, "none": NullDisplay}[kind]()
