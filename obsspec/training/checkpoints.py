"""Checkpoints that are complete or not there at all, and resume from the newest complete one.

    write_state(checkpoint_dir, state)          # last file of a save: marks the checkpoint complete
    found = find_checkpoints(checkpoints_dir)   # .resume_from (newest complete), .incomplete
    rotate(checkpoints_dir, keep)               # after the mark, never before; keeps the best by val

transformers' Trainer writes `checkpoints/checkpoint-N/` file by file (model, optimizer, scheduler,
RNG, trainer_state.json) and then calls the callbacks' `on_save`, where obsspec adds its own state
(obsspec/training/setup.py `StateSaver`). A kill can land anywhere in that, so:
- `obsspec_state.json` is the last file of a save and is written aside, then renamed into place:
  a checkpoint holding it (and the trainer's state) is complete; any other is an interrupted save.
- Resume takes the newest complete checkpoint, or starts from step 0 when there is none, and
  removes the incomplete ones (the redone steps save into the same names).
- Rotation (`train.save_total_limit`) is ours and runs after the mark. transformers' own runs inside
  the trainer's save, before obsspec's state exists, so with `save_total_limit=1` it deleted the
  only complete checkpoint in favour of the one being written.
- Rotation never removes the checkpoint of best measured val success (`val.json`, written by
  obsspec/training/checkpoint_val.py with `train.eval_checkpoints`): `obsspec export --best`
  picks it.
- A checkpoint leaves the listing (renamed to `.removing-*`) before its files are deleted: one
  killed half-way through a deletion cannot pass for complete.

`reached(point, checkpoint_dir)` is called at each named point of a save; it does nothing. Tests
replace it to crash there (tests/test_training_cli.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

STATE_FILE = "obsspec_state.json"
VAL_FILE = "val.json"  # val success measured on the checkpoint's weights (train.eval_checkpoints)
TRAINER_STATE = "trainer_state.json"  # transformers' last file of its own save
_NAME = re.compile(r"^checkpoint-(\d+)$")
_REMOVING = ".removing-"

# The points of a save, in order, that `reached` names (the trainer's own files come before all).
POINTS = ("trainer-saved", "state-written", "complete")


def reached(point: str, checkpoint_dir: str) -> None:
    """A named point of a checkpoint save: `trainer-saved` (the trainer's files are written, ours
    are not), `state-written` (our state is in its temporary file, not in place), `complete`
    (marked complete, older checkpoints not yet rotated)."""


# ---------------------------------------------------------------------------------------------
# Writing


def write_state(checkpoint_dir: str, state: dict) -> None:
    """obsspec's state, written aside then renamed into place: the checkpoint is complete after."""
    reached("trainer-saved", checkpoint_dir)
    path = os.path.join(checkpoint_dir, STATE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    reached("state-written", checkpoint_dir)
    os.replace(tmp, path)
    reached("complete", checkpoint_dir)


def read_state(checkpoint_dir: str) -> dict:
    with open(os.path.join(checkpoint_dir, STATE_FILE)) as f:
        return json.load(f)


def is_complete(checkpoint_dir: str) -> bool:
    if not os.path.exists(os.path.join(checkpoint_dir, TRAINER_STATE)):
        return False
    try:  # (a run saved before the state was written aside may hold a truncated one)
        return isinstance(read_state(checkpoint_dir), dict)
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# Finding, rotating


@dataclasses.dataclass
class Checkpoints:
    resume_from: str | None      # the newest complete checkpoint (None: there is none)
    incomplete: list[str]        # interrupted saves newer than it (older ones are rotated away)
    complete: list[str]          # oldest first

    def describe(self, root: str) -> str:
        """One console line: where the run resumes, and the interrupted saves it skips."""
        skipped = ""
        if self.incomplete:
            names = ", ".join(os.path.basename(p) for p in self.incomplete)
            skipped = f"; skipping {names}: its save was interrupted (removed)"
        if self.resume_from is None:
            return f"resuming from step 0: {root} holds no complete checkpoint{skipped}"
        return f"resuming from {self.resume_from} (step {step_of(self.resume_from)}){skipped}"


def step_of(checkpoint_dir: str) -> int:
    return int(_NAME.match(os.path.basename(checkpoint_dir)).group(1))


def _listed(root: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    names = [n for n in os.listdir(root) if _NAME.match(n) and os.path.isdir(os.path.join(root, n))]
    return [os.path.join(root, n) for n in sorted(names, key=lambda n: int(_NAME.match(n).group(1)))]


def find_checkpoints(root: str) -> Checkpoints:
    listed = _listed(root)
    complete = [p for p in listed if is_complete(p)]
    newest = complete[-1] if complete else None
    after = step_of(newest) if newest else -1
    return Checkpoints(newest, [p for p in listed if p not in complete and step_of(p) > after], complete)


def read_val(checkpoint_dir: str) -> dict | None:
    """The val figures measured on this checkpoint (`train.eval_checkpoints`), or None."""
    try:
        with open(os.path.join(checkpoint_dir, VAL_FILE)) as f:
            val = json.load(f)
    except (OSError, ValueError):
        return None
    return val if isinstance(val, dict) and isinstance(val.get("success_frac"), (int, float)) else None


def best(measured: dict[str, float]) -> str | None:
    """The checkpoint of highest val success (the newest of equals: it trained longer)."""
    if not measured:
        return None
    return max(measured, key=lambda path: (measured[path], step_of(path)))


def remove(checkpoint_dir: str) -> None:
    """Out of the listing first (a rename), then deleted: a half-deleted one is never listed."""
    root, name = os.path.split(checkpoint_dir)
    aside = os.path.join(root, _REMOVING + name)
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(checkpoint_dir, aside)
    shutil.rmtree(aside, ignore_errors=True)


def rotate(root: str, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; remove older ones, and interrupted saves older
    than the newest complete one (leftovers of deletions too)."""
    for name in os.listdir(root):
        if name.startswith(_REMOVING):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    found = find_checkpoints(root)
    if found.resume_from is None:
        return
    kept = set(found.complete[-keep:]) | set(found.incomplete)
    val = {path: v["success_frac"] for path in found.complete if (v := read_val(path)) is not None}
    kept.add(best(val))  # (None when nothing was measured)
    for path in _listed(root):
        if path not in kept:
            remove(path)
