"""World-model examples from recorded episodes: sources -> episodes -> split -> rows and cases.

    episodes = load_episodes(["runs/tasks", "runs/rollout"])
    train, held_out = split_by_task(episodes, eval_fraction=0.2, seed=0)
    rows, counts = examples(fmt, train, max_length=2048)      # SFT rows, loss on observations
                                                               # (longer episodes in windows)
    cases = eval_cases(fmt, held_out)                          # "context -> real body" steps

Sources (one or several at once):
- a prepared task suite: its `trajectories.jsonl` (the reference solutions `prepare-tasks`
  recorded; an imported Harbor suite has the same file);
- an `obsspec rollout` run directory (`trajectories-<mode>.jsonl`) or an `obsspec train` run
  directory (`rollouts/step-*.jsonl`): `Trajectory.to_dict()` per line;
- one JSONL file of either kind (e.g. a kit's `rollouts.jsonl`);
- a Harbor job folder, a trial folder or a folder of them (obsspec/atif.py): each trial's ATIF
  steps become a reference row (its commands, the observation it saw), its task the trial's task,
  so every trial of a held-out task is held out together. Unreadable trials are skipped, counted
  (`skipped_trials`).

An example is exactly the context the rollout gives the world model: reference rows are laid
out by `obsspec.tokens.transcript` (whose `wm_mask` targets are what `wm_prompt_ids` predicts),
rollouts keep their own token ids and `wm_mask` (error observations of malformed calls carry no
mask, so they are never targets). Evaluation cases come from `obsspec.worldmodel.cases`
(`reference_cases`, `trajectory_cases`), the one place that cuts "context -> body" steps.
The split is by task instance (a hash of the task id and the seed), so every episode of a
held-out task, reference or rollout, is held out together; identical rows are counted and kept once.
With `world_model.workspace_snapshot`, `snapshot_table(episodes, source_tasks(paths), snapshots)`
gives each task's snapshot ids, which `examples` and `eval_cases` put ahead of rows and prompts.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass

from obsspec import atif
from obsspec.env.task import Task
from obsspec.rollout.trajectory import Trajectory
from obsspec import windows
from obsspec.tokens import as_view, wm_row
from obsspec.worldmodel.config import WorldModelError


class DataError(WorldModelError):
    """A data source that is missing or that holds no recognisable episodes."""


@dataclass(frozen=True)
class Episode:
    """One recorded episode: a reference row (suite) or a rollout `Trajectory`, never both."""

    task_id: str
    source: str
    reference: dict | None = None
    trajectory: Trajectory | None = None


# ---------------------------------------------------------------------------------------------
# Sources


def source_files(path: str) -> list[str]:
    """The JSONL files a source path stands for (DataError if none)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise DataError(f"{path}: no such data source (a task suite, a rollout/train run "
                        "directory, or a trajectories JSONL file)")
    # a train run keeps each step's episodes as a rollout run under rollouts/step-NNNNNN/
    for pattern in ("trajectories.jsonl", "trajectories-*.jsonl", "rollouts/step-*/trajectories-*.jsonl",
                    "rollouts/*.jsonl", "rollouts.jsonl"):
        found = sorted(glob.glob(os.path.join(path, pattern)))
        if found:
            return found
    raise DataError(f"{path}: no trajectories.jsonl (task suite), trajectories-*.jsonl (rollout "
                    "run) or rollouts/step-*/trajectories-*.jsonl (train run) there")


def load_episodes(paths: list[str] | tuple[str, ...], skipped: list | None = None) -> list[Episode]:
    """Every episode of `paths`; unreadable Harbor trials are appended to `skipped` (folder, why)."""
    if not paths:
        raise DataError("no data: give --data DIR (a task suite, a run directory or a Harbor job)")
    episodes: list[Episode] = []
    for path in paths:
        trials = atif.find_trials([path]) if os.path.isdir(path) else []
        if trials and not _has_jsonl(path):
            episodes += _harbor_episodes(path, skipped)
            continue
        for file in source_files(path):
            episodes += _read(file)
    return episodes


def _has_jsonl(path: str) -> bool:
    try:
        return bool(source_files(path))
    except DataError:
        return False


def _harbor_episodes(path: str, skipped: list | None) -> list[Episode]:
    trials, bad = atif.read_trials([path])
    if skipped is not None:
        skipped += bad
    if not trials:
        raise DataError(f"{path}: no readable Harbor trial ({len(bad)} skipped"
                        + (f": {bad[0][1]})" if bad else ")"))
    return [Episode(t.task, t.path, reference={
        "task_id": t.task, "instruction": t.instruction,
        "steps": [{"command": "\n".join(s.commands), "observation": s.observation} for s in t.steps]})
        for t in trials if t.steps]


def _read(file: str) -> list[Episode]:
    out = []
    with open(file, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
                if "steps" in row and "instruction" in row:
                    out.append(Episode(row["task_id"], file, reference=row))
                else:
                    tr = Trajectory.from_dict(row)
                    out.append(Episode(tr.task_id, file, trajectory=tr))
            except (ValueError, KeyError, TypeError, AttributeError) as e:  # (a "str" line, bad types)
                raise DataError(f"{file}:{n}: neither a reference trajectory nor a rollout "
                                f"trajectory ({type(e).__name__}: {e})") from None
    return out


# ---------------------------------------------------------------------------------------------
# Split, examples, cases


def held_out(task_id: str, eval_fraction: float, seed: int) -> bool:
    """Whether a task instance is held out: stable for the task, whatever else is in the data."""
    digest = hashlib.sha256(f"{seed}/{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 < eval_fraction


def split_by_task(episodes: list[Episode], eval_fraction: float, seed: int
                  ) -> tuple[list[Episode], list[Episode]]:
    held = [e for e in episodes if held_out(e.task_id, eval_fraction, seed)]
    if eval_fraction > 0 and not held and len({e.task_id for e in episodes}) > 1:
        # a handful of tasks can all hash above the line: hold out the lowest one
        lowest = min({e.task_id for e in episodes},
                     key=lambda t: hashlib.sha256(f"{seed}/{t}".encode()).digest())
        held = [e for e in episodes if e.task_id == lowest]
    tasks = {e.task_id for e in episodes}
    if eval_fraction < 1 and len(tasks) > 1 and {e.task_id for e in held} == tasks:
        # ... or all below it: keep the highest one for training
        highest = max(tasks, key=lambda t: hashlib.sha256(f"{seed}/{t}".encode()).digest())
        held = [e for e in held if e.task_id != highest]
    ids = {e.task_id for e in held}
    return [e for e in episodes if e.task_id not in ids], held


def examples(fmt, episodes: list[Episode], max_length: int,
             snapshots: dict | None = None) -> tuple[list[dict], dict]:
    """SFT rows {"input_ids", "completion_mask"} and counts: episodes cut into windows (longer
    than `max_length`: obsspec/windows.py, each observation whole), observations too long to fit
    the budget alone (dropped), episodes without a target, duplicate rows. `snapshots`: task_id ->
    the task's `tokens.WorldView` (its snapshot ahead of every row of that task, its hints after
    each call)."""
    from obsspec.models.warmstart import examples as reference_examples

    rows, seen = [], set()
    counts = {"episodes": len(episodes), "cut": 0, "too_long": 0, "no_target": 0, "duplicates": 0}
    for e in episodes:
        view = snapshots[e.task_id] if snapshots is not None else ()
        if e.reference is not None:  # the whole episode in one row, cut below
            whole, _ = reference_examples(fmt, [e.reference], "world_model", 1 << 62, snapshots)
            row = whole[0] if whole else None
        else:  # one layout (hints are rebuilt from the ids) serves the length check and the row
            row = wm_row(view, e.trajectory.ids, e.trajectory.wm_mask)
        got, dropped = windows.fit(row, max_length, len(as_view(view).prefix)) if row else ([], 0)
        counts["cut"] += int(row is not None and len(row["input_ids"]) > max_length)
        counts["too_long"] += dropped
        counts["no_target"] += int(not got and not dropped)
        for row in got:
            key = hashlib.sha256(json.dumps([row["input_ids"], row["completion_mask"]]).encode()).digest()
            if key in seen:
                counts["duplicates"] += 1
                continue
            seen.add(key)
            rows.append(row)
    counts["examples"] = len(rows)
    return rows, counts


def eval_cases(fmt, episodes: list[Episode], snapshots: dict[str, list[int]] | None = None
               ) -> tuple[list, int]:
    """Deduplicated held-out steps (`WMCase`s) and how many duplicates were removed
    (`snapshots`: as in `examples`)."""
    from obsspec.worldmodel.cases import reference_cases, trajectory_cases

    cases, seen, duplicates = [], set(), 0
    for e in episodes:
        got = reference_cases(fmt, [e.reference], snapshots) if e.reference is not None \
            else trajectory_cases(fmt, [e.trajectory], snapshots)
        for case in got:
            key = (case.prompt_ids, case.body)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            cases.append(case)
    return cases, duplicates


def source_tasks(paths: list[str] | tuple[str, ...]) -> dict[str, Task]:
    """task_id -> Task for the episodes of `paths`: a suite's train/val.jsonl, a rollout run's
    episodes.jsonl (also of each step of a train run), found next to the trajectory files."""
    from obsspec.env.suite import identity, load_tasks

    tasks: dict[str, Task] = {}
    found_in: dict[str, str] = {}

    def add(found: list[Task], where: str) -> None:
        for t in found:
            old = tasks.get(t.task_id)
            if old is not None and identity(old) != identity(t):
                # Suites prepared with other seeds reuse ids (dir-stats-00000 ...): a silent
                # overwrite would put one task's workspace ahead of another task's episodes.
                raise DataError(f"task id {t.task_id!r} names two different tasks ({found_in[t.task_id]} "
                                f"and {where}): give sources of one suite to one run (e.g. --data for "
                                "one suite, --eval-on for the other)")
            tasks[t.task_id], found_in[t.task_id] = t, where

    for path in paths:
        for file in source_files(path):
            folder = os.path.dirname(file)
            for name in ("train.jsonl", "val.jsonl"):
                if os.path.exists(os.path.join(folder, name)):
                    add(load_tasks(os.path.join(folder, name)), os.path.join(folder, name))
            eps = os.path.join(folder, "episodes.jsonl")
            if os.path.exists(eps):
                with open(eps) as f:
                    add([Task.from_dict(json.loads(line)["task"]) for line in f if line.strip()], eps)
    return tasks


def snapshot_table(episodes: list[Episode], tasks: dict[str, Task], snapshots) -> dict:
    """task_id -> `tokens.WorldView` for every task of `episodes`, from `snapshots` (a
    `WorkspaceSnapshots`: a task it has built is not built again); DataError if one of them has
    no task to take the workspace from."""
    import asyncio

    missing = sorted({e.task_id for e in episodes} - set(tasks))
    if missing:
        raise DataError(f"world_model.workspace_snapshot and hint_tokens need each episode's task, and {missing[0]!r} has "
                        "none next to its data (a suite's train/val.jsonl or a rollout run's episodes.jsonl)")
    needed = [tasks[t] for t in sorted({e.task_id for e in episodes})]
    return asyncio.run(snapshots.table(needed))


def determinism_ceiling(paths: list[str] | tuple[str, ...], episodes: list[Episode]) -> float | None:
    """Share of the reference steps of `episodes` whose observation was the same in two fresh
    runs (a suite's determinism.json): no world model can beat it. None when not measured."""
    differing, measured = set(), False
    for path in paths:
        file = os.path.join(path, "determinism.json") if os.path.isdir(path) else ""
        if file and os.path.exists(file):
            with open(file) as f:
                d = json.load(f)
            measured = measured or bool(d.get("commands_compared"))
            differing |= {(x["task_id"], x["turn"]) for x in d.get("differing", [])}
    steps = [(e.task_id, i) for e in episodes if e.reference is not None
             for i in range(len(e.reference["steps"]))]
    if not measured or not steps:
        return None
    return round(1 - sum(s in differing for s in steps) / len(steps), 4)
