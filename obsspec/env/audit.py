"""Cheap cheats run against an imported task's verifier at `prepare-tasks` time.

A verifier written for a benchmark can trust what the agent may change: an input it recomputes
the expected answer from, an answer file it only checks exists. Such a task rewards a cheat, and
RL finds cheats. Each cheat here needs no knowledge of the task beyond the paths its
instruction and tests name; a task that one passes (reward 1) is dropped, or kept and flagged
(`tasks.cheat_audit`), with the cheat's name in the manifest. `failed-run` is only ever flagged
(FLAG_ONLY): it runs the reference solution, so a task whose deliverable does not depend on its
inputs (a program, a fixed configuration) passes it honestly, and an agent cannot use it without
solving the task:

    empty-inputs       every file the instruction names, emptied
    delete-inputs      every file the instruction names, deleted
    placeholder        '0' written to every file the tests (or the instruction) name, inputs included
    failed-run         the reference solution run on emptied inputs, the inputs then put back:
                       outputs of a run that got everything wrong, in the right places (counted
                       only where that run, inputs left empty, fails: else nothing was wrong)
    pytest-hooks       a conftest.py in the workdir, HOME and / that reports every test passed
                       (only for tests that use pytest): a test.sh that collects from there
    venv-shims         `.venv/bin/{activate,python,python3,pytest}` in the workdir that exit 0
                       (only for tests that name a venv): a test.sh that uses the agent's venv

    cheat_commands(task)            # {name: [shell command]}
    await audit(task, config)       # names of the cheats that pass its verifier
"""

from __future__ import annotations

import posixpath
import re
import shlex

from obsspec.env.episode import run_scripted
from obsspec.env.task import Task, texts

MODES = ("drop", "flag", "off")
FLAG_ONLY = {"failed-run"}  # cheats that run the task's own solution: flagged, never dropped
# (paths of the system, the verifier's own places and the harness's: never an input or answer)
NOT_TASK_PATHS = ("/tests", "/logs", "/proc", "/dev", "/sys", "/usr", "/bin", "/sbin", "/lib",
                  "/lib64", "/etc", "/run", "/var/lib", "/opt/conda", "/root/.cache")
PASS_ALL = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    report.outcome = "passed"
"""
_ABSOLUTE = re.compile(r"(?<![\w.$/~}:-])(/(?:[\w.-]+/)*[\w.-]*\w)")
# `name.ext` (a letter-only extension, not a call such as `json.load(`), relative to the workdir
_RELATIVE = re.compile(r"(?<![\w./$~}:-])([\w-]+(?:/[\w.-]+)*\.[A-Za-z]{1,8})\b(?![(\w])")


def named_paths(text: str, workdir: str, relative: bool = True) -> list[str]:
    """Absolute paths of the files `text` names: absolute ones, and (with `relative`) `name.ext`
    relative to the workdir; the system's, the verifier's and the harness's places left out."""
    found = set(_ABSOLUTE.findall(text))
    if relative:
        found |= {posixpath.join(workdir, rel) for rel in _RELATIVE.findall(text)}
    found = {posixpath.normpath(p) for p in found}
    return sorted(p for p in found if p.count("/") > 1 or posixpath.splitext(p)[1]
                  if not any(p == d or p.startswith(d + "/") for d in NOT_TASK_PATHS))


def tests_text(task: Task) -> str:
    """What the task's own tests say: its test files and the variables its verifier exports (not
    the harness's wrapper around them)."""
    exports = [line for line in task.verify.splitlines() if line.startswith("export ")]
    return "\n".join([*exports, *texts(task.verify_files)])


def cheat_commands(task: Task) -> dict[str, list[str]]:
    """The cheats, as shell commands for this task (none without a named path)."""
    inputs = named_paths(task.instruction, task.workdir)
    read = sorted(set(inputs) | set(named_paths(tests_text(task), task.workdir, relative=False)))
    q = " ".join(shlex.quote(p) for p in inputs)
    out: dict[str, list[str]] = {}
    if inputs:
        out["empty-inputs"] = [f"for f in {q}; do [ -f \"$f\" ] && : > \"$f\"; done; true"]
        out["delete-inputs"] = [f"rm -f -- {q}; true"]
        if task.solution:
            keep = "/tmp/.obsspec-audit"
            save = (f"mkdir -p {keep}; for f in {q}; do [ -f \"$f\" ] && cp -p -- \"$f\" {keep}/\"$(echo \"$f\" | tr / _)\" "
                    f"&& : > \"$f\"; done; true")
            back = (f"for f in {q}; do b={keep}/\"$(echo \"$f\" | tr / _)\"; [ -f \"$b\" ] && cp -p -- \"$b\" \"$f\"; done; "
                    f"rm -rf {keep}; true")
            out["failed-run"] = [save, *task.solution, back]
    if "pytest" in tests_text(task) or "pytest" in task.verify:
        places = f'{shlex.quote(task.workdir)} "$HOME" /'
        out["pytest-hooks"] = [f"for d in {places}; do printf %s {shlex.quote(PASS_ALL)} > \"$d/conftest.py\"; "
                               f"done 2>/dev/null; true"]
    if ".venv" in tests_text(task) or "bin/activate" in tests_text(task):
        bin_ = shlex.quote(posixpath.join(task.workdir, ".venv/bin"))
        out["venv-shims"] = [f"mkdir -p {bin_} && for t in python python3 pytest; do printf '#!/bin/sh\\nexit 0\\n' "
                             f"> {bin_}/$t; chmod +x {bin_}/$t; done; echo \"export PATH={bin_}:\\$PATH\" > {bin_}/activate"]
    if read:
        zero = " ".join(shlex.quote(p) for p in read)
        out["placeholder"] = [f"for f in {zero}; do [ -d \"$f\" ] || {{ mkdir -p \"$(dirname \"$f\")\"; echo 0 > \"$f\"; }}; "
                              f"done 2>/dev/null; true"]
    return out


async def audit(task: Task, config) -> list[str]:
    """Names of the cheats that pass `task`'s verifier (reward 1). A cheat whose episode failed in
    the sandbox does not count as passing."""
    async def passes(commands: list[str]) -> bool:
        record = await run_scripted(task, commands, config)
        return not record.infra_error and record.reward is not None and record.reward >= 1.0

    passed = []
    for name, commands in cheat_commands(task).items():
        if await passes(commands) and not (name == "failed-run" and await passes(commands[:-1])):
            passed.append(name)
    return passed
