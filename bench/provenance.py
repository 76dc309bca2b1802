"""Where a benchmark result came from: the command line, the commit and the date, stamped into
its JSON so that a figure in docs/BENCHMARKS.md can be traced and re-measured.

    from provenance import emit, stamp
    emit({**stamp(), "results": ...}, args.out)   # print it, and write it to --out when given
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys

from obsspec.provenance import commit


def stamp() -> dict:
    """The command that is running, the checkout's commit (with `+dirty` when it has changes)
    and today's date (UTC)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.relpath(os.path.abspath(sys.argv[0]), root)
    return {"command": shlex.join([".venv/bin/python", script, *sys.argv[1:]]), "commit": commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def emit(result: dict, out: str = "") -> None:
    """Print `result` as indented JSON and, when `out` is given, write it there too."""
    print(json.dumps(result, indent=2))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
