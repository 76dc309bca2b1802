"""obsspec's episodes as Harbor trial folders (ATIF-v1.6), so that Harbor's own tools read them.

    recorder = AtifRecorder()              # an event consumer: bus.subscribe(recorder)
    ... the batch runs ...
    write_trials(out_dir + "/atif/speculative", tasks, trajectories, recorder, mode="speculative")

Each episode becomes `<task_id>__e<episode>/` with `agent/trajectory.json` and `result.json` (a
Harbor trial result: the task's name and content hash, the verifier's reward, the infrastructure
error if any, the episode's start and end). The
trajectory: the instruction as the user's step, then one agent step per committed turn: the
action's text as its message, a `bash` tool call with its command, the observation the agent saw,
token counts, and the time the action was there. obsspec's own figures go under `extra.obsspec`:
the turn's speculation outcome (match, rollback, exec_won, no_draft, skipped, or none), the
draft's source, the tool's seconds, and for a match the time hidden (how long the next action's
kept speculative generation ran while this step's tool still ran). obsspec/atif.py reads them back (`simulate --from`).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from obsspec.env.task import Task
from obsspec.rollout.events import Event
from obsspec.rollout.trajectory import Trajectory, action_spans

SCHEMA = "ATIF-v1.6"


class AtifRecorder:
    """What the event stream says that a trajectory does not: when each committed action was
    there, the draft's source, and what a match hid."""

    def __init__(self) -> None:
        self.wall0 = time.time()
        self.t0: float | None = None            # the bus's time at our first event
        self.start: dict[int, float] = {}        # episode -> its start
        self.action_at: dict[tuple[int, int], float] = {}
        self.source: dict[tuple[int, int], str] = {}
        self.hidden: dict[tuple[int, int], float] = {}
        self._exec_done: dict[tuple[int, int], float] = {}
        self._spec_start: dict[str, float] = {}
        self._matched: dict[str, tuple[int, int]] = {}

    def __call__(self, e: Event) -> None:
        if self.t0 is None:
            self.t0 = e.t
            self.wall0 = time.time()
        d, key = e.data, (e.episode, e.turn)
        if e.kind == "episode_start":
            self.start[e.episode] = e.t
        elif e.kind == "policy_done" and not d.get("speculative"):
            self.action_at[key] = e.t
        elif e.kind == "spec_start":
            self._spec_start[d["request_id"]] = e.t
        elif e.kind == "exec_done":
            self._exec_done[key] = e.t
        elif e.kind in ("match", "rollback"):
            self.source[key] = d.get("source", "")
            if e.kind == "match" and d.get("request_id"):
                self._matched[d["request_id"]] = (e.episode, e.turn + 1)
                if not d.get("pending"):  # (its action was already there: it is there now)
                    self.action_at.setdefault((e.episode, e.turn + 1), e.t)
        elif e.kind == "request_end" and d.get("request_id") in self._matched and d.get("outcome") == "committed":
            episode, turn = self._matched.pop(d["request_id"])
            self.action_at.setdefault((episode, turn), e.t)  # (a pending match: there when it ended)
            started = self._spec_start.get(d["request_id"])
            tool_end = self._exec_done.get((episode, turn - 1))
            if started is not None and tool_end is not None:
                self.hidden[(episode, turn - 1)] = round(max(0.0, min(tool_end, e.t) - started), 4)

    def wall(self, t: float) -> str:
        return datetime.fromtimestamp(self.wall0 + t - (self.t0 or 0.0), timezone.utc).isoformat()


def trial_document(task: Task, tr: Trajectory, rec: AtifRecorder, mode: str, model: str = "") -> dict:
    """The ATIF trajectory of one episode."""
    start = rec.start.get(tr.episode, 0.0)
    steps = [{"step_id": 1, "timestamp": rec.wall(start), "source": "user", "message": task.instruction}]
    spans = action_spans(tr.policy_mask)  # (prompt tokens, action tokens) of each committed action
    for k, turn in enumerate(tr.turns):
        prompt, tokens = spans[k] if k < len(spans) else (0, 0)
        step = {"step_id": len(steps) + 1, "timestamp": rec.wall(rec.action_at.get((tr.episode, k), start)),
                "source": "agent", "message": turn.action,
                "metrics": {"prompt_tokens": prompt, "completion_tokens": tokens}}
        ours = {"speculation": turn.spec or None, "draft_source": rec.source.get((tr.episode, k)),
                "tool_sec": round(turn.tool_sec, 4), "kind": turn.kind}
        if (tr.episode, k) in rec.hidden:
            ours["hidden_sec"] = rec.hidden[(tr.episode, k)]
        if turn.kind == "bash":
            call = f"call_{k}"
            step["tool_calls"] = [{"tool_call_id": call, "function_name": "bash",
                                   "arguments": {"command": turn.command}}]
            step["observation"] = {"results": [{"source_call_id": call, "content": turn.observation}]}
        elif turn.kind == "error" and turn.observation:
            step["observation"] = {"results": [{"content": turn.observation}]}
        step["extra"] = {"obsspec": ours}
        steps.append(step)
    return {"schema_version": SCHEMA, "session_id": f"obsspec-{mode}-{tr.episode}",
            "agent": {"name": "obsspec-policy", "version": "1", "model_name": model or None,
                      "extra": {"mode": mode}},
            "steps": steps,
            "final_metrics": {"total_prompt_tokens": sum(p for p, _ in spans),
                              "total_completion_tokens": sum(n for _, n in spans), "total_steps": len(steps)}}


def write_trials(out_dir: str, tasks: list[Task], trajectories: list[Trajectory], rec: AtifRecorder,
                 mode: str, model: str = "", first_episode: int = 0) -> int:
    """One trial folder per episode under `out_dir`; returns how many."""
    for i, tr in enumerate(trajectories):
        task = tasks[tr.episode - first_episode] if 0 <= tr.episode - first_episode < len(tasks) else tasks[i]
        name = f"{tr.task_id}__e{tr.episode}"
        folder = os.path.join(out_dir, name)
        os.makedirs(os.path.join(folder, "agent"), exist_ok=True)
        with open(os.path.join(folder, "agent", "trajectory.json"), "w") as f:
            json.dump(trial_document(task, tr, rec, mode, model), f, indent=2)
        started = rec.wall(rec.start.get(tr.episode, 0.0))
        finished = rec.wall(rec.start.get(tr.episode, 0.0) + tr.latency_sec)
        result = {"task_name": tr.task_id, "trial_name": name, "trial_uri": Path(os.path.abspath(folder)).as_uri(),
                  "task_id": {"path": tr.task_id}, "task_checksum": task.content_hash(),
                  "config": {"task": {"path": tr.task_id}, "trial_name": name},
                  "agent_info": {"name": "obsspec-policy", "version": "1",
                                 "model_info": {"name": model, "provider": "obsspec"} if model else None},
                  "verifier_result": None if tr.reward is None else {"rewards": {"reward": tr.reward}},
                  "exception_info": {"exception_type": "InfrastructureError", "exception_message": tr.infra_error,
                                     "exception_traceback": "", "occurred_at": finished} if tr.infra_error else None,
                  "started_at": started, "finished_at": finished,
                  "agent_execution": {"started_at": started, "finished_at": finished}}
        with open(os.path.join(folder, "result.json"), "w") as f:
            json.dump(result, f, indent=2)
    return len(trajectories)
