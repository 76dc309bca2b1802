"""Reading the JSONL files a run appends to (metrics, episodes, trajectories), and writing JSON
and JSONL files whole.

    rows = read_jsonl(path, ReportError)     # each row a dict; a bad line raises ReportError
    write_json(path, obj); write_jsonl(path, rows)   # written aside, then renamed into place

A run killed while appending leaves its last line cut short (no newline at the end): that line
is dropped, so the run can still be resumed or reported. Any other line that is not a JSON
object is an error naming the file and line, of the caller's error class (one line for the CLI).
"""

from __future__ import annotations

import json
import os


def read_jsonl(path: str, error: type[Exception] = ValueError) -> list[dict]:
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    rows = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
            if n == len(lines):  # the last line, with no newline after it: cut short by a crash
                continue
            raise error(f"{path}:{n}: not a JSON line ({e})") from None
        if not isinstance(row, dict):
            raise error(f"{path}:{n}: not a JSON object")
        rows.append(row)
    return rows


def write_json(path: str, obj) -> None:
    """`obj` as indented JSON with sorted keys, written aside and renamed into place: a reader
    (or a resumed run) never sees half a file."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def write_jsonl(path: str, rows) -> None:
    """One JSON object per line (sorted keys), written aside and renamed into place."""
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    os.replace(path + ".tmp", path)
