"""`obsspec shell`: a task's sandbox, driven by hand, showing what the agent would see.

    obsspec shell find-by-name-00003 -c 'ls -la' -c 'cat notes.txt'
    obsspec shell find-by-name-00003            # interactive; Ctrl-D ends, then the verifier runs

What reaches the terminal is escaped (`for_terminal`): an agent's output, or a task's text, holding
ESC or CR could clear the screen or print a fake "verifier reward: 1" over the real one. The
observation the policy sees is not changed.

The header says which semantics the task runs with (obsspec/env/semantics.py): a built-in task's
isolated sandbox, or an imported task's Harbor container, with what each means.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Callable, Iterable

from obsspec import chat
from obsspec.env.episode import observation, start_sandbox, verify_task
from obsspec.env.sandbox import SandboxConfig, SandboxError
from obsspec.env.semantics import ISOLATED, describe
from obsspec.env.suite import SuiteError, TaskNotFound, load_tasks, task_by_id
from obsspec.env.task import Task


def find_task(task_id: str, tasks_dir: str | None, seed: int) -> Task:
    """A task from a prepared suite (when given) or rebuilt from a built-in task id."""
    if tasks_dir:
        for task in load_tasks(tasks_dir):
            if task.task_id == task_id:
                return task
        raise TaskNotFound(f"task {task_id!r} is not in {tasks_dir}")
    return task_by_id(task_id, seed)


async def shell_session(task: Task, config: SandboxConfig, commands: Iterable[str] | None,
                        emit: Callable[[str], None], verify: bool = True) -> dict:
    """Run commands (or read them from stdin when None) and emit each observation as the agent
    sees it. Returns a summary: commands run, exit codes, reward."""
    sandbox = await start_sandbox(task, config)
    exit_codes = []
    try:
        emit(f"# task {task.task_id} ({task.family}), workdir {task.workdir}\n"
             f"# semantics: {task.semantics or ISOLATED}\n"
             + "".join(f"#   - {line}\n" for line in describe(task.semantics))
             + f"# {task.instruction}\n")
        for command in commands if commands is not None else _stdin_commands(task.workdir):
            result = await sandbox.run(command)
            exit_codes.append(result.exit_code)
            emit(chat.wrap_observation(observation(result, config)) + "\n")
        reward = await verify_task(sandbox, task) if verify else None
        if reward is not None:
            emit(f"# verifier reward: {reward:g}\n")
        return {"task_id": task.task_id, "commands": len(exit_codes), "exit_codes": exit_codes,
                "reward": reward}
    finally:
        await sandbox.close()


def for_terminal(text: str) -> str:
    """`text` with every control and format character but newline and tab written out as an
    escape (`\\x1b`, `\\r`, `\\u202e`), so nothing of it is a terminal command."""
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def _stdin_commands(workdir: str):
    while True:
        if sys.stdin.isatty():
            sys.stderr.write(f"agent@sandbox:{workdir}$ ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield line.rstrip("\n")


def run_shell(task: Task, config: SandboxConfig, commands: list[str] | None, verify: bool) -> dict:
    def emit(text: str) -> None:
        sys.stdout.write(for_terminal(text))
        sys.stdout.flush()

    try:
        return asyncio.run(shell_session(task, config, commands, emit, verify))
    except SandboxError as e:  # e.g. limits it cannot start under: one line, not a traceback
        raise SuiteError(f"{task.task_id}: the sandbox failed: {e}") from None
