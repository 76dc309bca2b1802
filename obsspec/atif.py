"""Harbor jobs read as terminal episodes: ATIF trajectories (the Agent Trajectory Interchange
Format, v1.0-1.8) of trial folders, in the one shape obsspec's simulator and world-model data need.

    trials, skipped = read_trials(["jobs/2026-04-15__16-35-22"])   # a job, a trial, or folders of them
    for trial in trials: trial.task, trial.reward, [(s.commands, s.observation, s.gen_s, s.tool_s) for s in trial.steps]

A trial folder holds `agent/trajectory.json` (ATIF) and `result.json` (the task's name and the
verifier's reward). Each agent step that called tools becomes one `AgentStep`: what it ran, what it
saw, and when. Two tool-call styles are read:
- a bash tool: each call's `arguments.command` (or `cmd`), its own observation result;
- Terminus-2: each call's `arguments.keystrokes` typed into a terminal, after which the agent waits
  `duration` seconds (1.0 when not given); the step's observation is the screen after all of them.
Times: a step's `timestamp` is when the model's answer arrived. The gap from the previous step is
that step's tool time plus this step's generation. Where the step records its tool time (`extra`
`duration_sec`/`tool_sec`, or obsspec's own under `extra.obsspec`), that is used; for Terminus-2 the tool time is the waits it asked for
(the least the terminal took); else the whole gap is counted as generation (said in `assumed`).
A trial whose schema version is unknown, whose JSON is malformed, or that has a malformed step is
skipped with one line (`skipped`: folder, reason), never a traceback.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime

SCHEMA_VERSIONS = {f"ATIF-v1.{n}" for n in range(9)}
BASH_KEYS = ("command", "cmd")
TERMINUS_DEFAULT_WAIT_S = 1.0


@dataclass
class AgentStep:
    commands: list[str]          # what the step ran, in order (keystrokes without the final newline)
    observation: str             # what the agent saw after them
    gen_s: float                 # the model's generation time for this step
    tool_s: float                # the time its tools took (or the least they took)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    style: str = "bash"          # "bash" | "keystrokes"


@dataclass
class Trial:
    path: str
    task: str
    reward: float | None
    instruction: str
    steps: list[AgentStep] = field(default_factory=list)
    assumed: set[str] = field(default_factory=set)   # what was not recorded and had to be assumed


class AtifError(ValueError):
    """A trial that cannot be read (one line: why)."""


def find_trials(paths: list[str]) -> list[str]:
    """Trial folders under `paths`: a trial itself (it holds agent/trajectory.json), a job (its
    subfolders are trials) or any folder of them, in name order."""
    out = []
    for root in paths:
        if not os.path.isdir(root):
            raise AtifError(f"{root}: no such folder")
        for here, dirs, files in os.walk(root):
            dirs.sort()
            if os.path.isfile(os.path.join(here, "agent", "trajectory.json")):
                out.append(here)
                dirs[:] = []
    return out


def read_trials(paths: list[str]) -> tuple[list[Trial], list[tuple[str, str]]]:
    """Every readable trial under `paths`, and (folder, reason) of those skipped."""
    trials, skipped = [], []
    for folder in find_trials(paths):
        try:
            trials.append(read_trial(folder))
        except AtifError as e:
            skipped.append((folder, str(e)))
    return trials, skipped


def _load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AtifError(f"{os.path.basename(path)}: {type(e).__name__}: {e}") from None
    if not isinstance(data, dict):
        raise AtifError(f"{os.path.basename(path)}: not a JSON object")
    return data


def _time(value, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise AtifError(f"{where}: timestamp {value!r} is not ISO 8601") from None


def _text(message) -> str:
    if isinstance(message, str):
        return message
    if isinstance(message, list):  # content parts (ATIF-v1.6)
        return "".join(p.get("text", "") for p in message if isinstance(p, dict))
    return ""


def read_trial(folder: str) -> Trial:
    traj = _load(os.path.join(folder, "agent", "trajectory.json"))
    version = traj.get("schema_version")
    if version not in SCHEMA_VERSIONS:
        raise AtifError(f"unknown ATIF schema version {version!r}")
    result = _load(os.path.join(folder, "result.json")) if os.path.exists(os.path.join(folder, "result.json")) else {}
    task = str(result.get("task_name") or (result.get("task_id") or {}).get("path", "")
               or os.path.basename(folder).split("__")[0])
    rewards = ((result.get("verifier_result") or {}).get("rewards") or {})
    reward = rewards.get("reward")
    steps = traj.get("steps")
    if not isinstance(steps, list) or not steps:
        raise AtifError("no steps")
    trial = Trial(folder, task, float(reward) if isinstance(reward, (int, float)) else None, "")
    previous: datetime | None = None
    pending_tool = 0.0  # the previous agent step's tool time: part of the gap to this one
    for n, step in enumerate(steps, 1):
        if not isinstance(step, dict) or step.get("source") not in ("system", "user", "agent"):
            raise AtifError(f"step {n}: malformed (no source)")
        at = _time(step.get("timestamp"), f"step {n}")
        if step["source"] == "user" and not trial.instruction:
            trial.instruction = _text(step.get("message"))
        if step["source"] != "agent":
            previous = at or previous
            continue
        calls = step.get("tool_calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise AtifError(f"step {n}: malformed tool_calls")
        parsed = _calls(calls, n)
        metrics = step.get("metrics") or {}
        extra = step.get("extra") or {}
        gap = (at - previous).total_seconds() if at is not None and previous is not None else None
        if gap is None:
            trial.assumed.add("missing timestamps: generation time unknown (0)")
        gen = max(0.0, (gap or 0.0) - pending_tool)
        previous = at or previous
        if not parsed:
            pending_tool = 0.0
            continue  # a step that ran nothing (the answer, or a wait with no keystrokes)
        style, commands, waits = parsed
        observation = _observation(step.get("observation"), n)
        ours = extra.get("obsspec") if isinstance(extra.get("obsspec"), dict) else {}
        recorded = next((src[k] for src in (extra, ours) for k in ("tool_sec", "duration_sec")
                         if isinstance(src.get(k), (int, float))), None)
        if recorded is not None:
            tool = float(recorded)
        elif style == "keystrokes":
            tool = sum(waits)
            trial.assumed.add("terminal: tool time = the waits the agent asked for (the least it took)")
        else:
            tool = 0.0
            trial.assumed.add("bash: no tool time recorded: the whole gap counted as generation")
        if not math.isfinite(tool) or tool < 0:
            raise AtifError(f"step {n}: tool time {tool!r}")
        trial.steps.append(AgentStep(commands, observation, gen, tool, int(metrics.get("completion_tokens") or 0),
                                     int(metrics.get("prompt_tokens") or 0), style))
        pending_tool = tool
    return trial


def _calls(calls: list[dict], n: int) -> tuple[str, list[str], list[float]] | None:
    """(style, commands, waits) of a step's tool calls; None when they ran nothing."""
    commands, waits, style = [], [], ""
    for c in calls:
        args = c.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise AtifError(f"step {n}: tool call arguments are not JSON") from None
        if not isinstance(args, dict):
            raise AtifError(f"step {n}: malformed tool call")
        if "keystrokes" in args:
            style = style or "keystrokes"
            keys = str(args.get("keystrokes") or "")
            wait = args.get("duration")
            waits.append(float(wait) if isinstance(wait, (int, float)) and math.isfinite(wait) and wait >= 0
                         else TERMINUS_DEFAULT_WAIT_S)
            if keys.strip():
                commands.append(keys.rstrip("\n"))
        elif any(k in args for k in BASH_KEYS):
            style = style or "bash"
            commands.append(str(next(args[k] for k in BASH_KEYS if k in args)))
    return (style, commands, waits) if commands else None


def _observation(obs, n: int) -> str:
    if obs is None:
        return ""
    if not isinstance(obs, dict) or not isinstance(obs.get("results", []), list):
        raise AtifError(f"step {n}: malformed observation")
    return "".join(_text(r.get("content")) if isinstance(r, dict) else "" for r in obs.get("results", []))
