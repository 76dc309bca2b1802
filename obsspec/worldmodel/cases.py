"""World-model cases: each executed command of a trajectory as "context -> real observation body".

    cases = reference_cases(fmt, rows) + trajectory_cases(fmt, trajectories)

A case's prompt is exactly what the rollout's world model is asked (`ChatFormat.wm_prompt_ids`:
history + action + the observation opening, after the task's workspace snapshot when there is
one). Reference rows come from a suite's trajectories.jsonl, trajectories from rollouts; error
observations of malformed calls are never targets. obsspec/worldmodel/evaluate.py judges drafts
on them, obsspec/worldmodel/data.py trains on the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from obsspec.rollout.trajectory import Trajectory
from obsspec.tokens import ChatFormat


@dataclass(frozen=True)
class WMCase:
    """One step: what the world model sees, and what the tool really printed."""

    prompt_ids: tuple[int, ...]   # history + action + observation opening (docs/ROLLOUT.md, "One turn")
    body: str                     # the real observation body
    command: str
    tool_sec: float = 0.0         # the tool's latency for this step, when recorded


def reference_cases(fmt: ChatFormat, rows: list[dict],
                    snapshots: Mapping[str, Sequence[int]] | None = None) -> list[WMCase]:
    """Cases from reference trajectories (rows of a suite's trajectories.jsonl); `snapshots`:
    task_id -> workspace snapshot ids ahead of each prompt."""
    cases = []
    for row in rows:
        snapshot = snapshots[row["task_id"]] if snapshots is not None else ()
        history = fmt.prompt_ids(row["instruction"])
        for step in row["steps"]:
            action = fmt.action_ids(fmt.render_bash(step["command"]))
            cases.append(WMCase(tuple(fmt.wm_prompt_ids(history, action, snapshot)), step["observation"],
                                step["command"]))
            history = history + action + fmt.observation_ids(step["observation"])[0]
    return cases


def trajectory_cases(fmt: ChatFormat, trajectories: list[Trajectory],
                     snapshots: Mapping[str, Sequence[int]] | None = None) -> list[WMCase]:
    """Cases from rollouts: each executed command's observation, with everything before it.

    The observation body starts where a run of `wm_mask` begins (error observations of malformed
    calls are not targets and carry no mask), so the prompt is exactly the rollout's context
    (after the task's workspace snapshot, with `snapshots`: task_id -> ids)."""
    cases = []
    for tr in trajectories:
        snapshot = snapshots[tr.task_id] if snapshots is not None else ()
        starts = [i for i, m in enumerate(tr.wm_mask) if m and (i == 0 or not tr.wm_mask[i - 1])]
        bash = [t for t in tr.turns if t.kind == "bash"]
        opening = len(fmt.obs_prefix_ids)  # the context ends with the observation opening
        for start, turn in zip(starts, bash):
            cases.append(WMCase(tuple(fmt.wm_prompt_ids(tr.ids[:start - opening], snapshot_ids=snapshot)),
                                turn.observation, turn.command, turn.tool_sec))
    return cases
