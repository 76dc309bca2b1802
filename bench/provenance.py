"""Where a benchmark result came from: the command line, the commit and the date, stamped into
its JSON so that a figure in docs/BENCHMARKS.md can be traced and re-measured.

    from provenance import stamp
    print(json.dumps({**stamp(), "results": ...}))
"""

from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys


def stamp() -> dict:
    """The command that is running, the checkout's commit (with `+dirty` when it has changes)
    and today's date (UTC)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    script = os.path.relpath(os.path.abspath(sys.argv[0]), root)
    return {"command": shlex.join([".venv/bin/python", script, *sys.argv[1:]]), "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
