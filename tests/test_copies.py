"""Copy rows read back out of the workspace snapshot (obsspec/worldmodel/copies.py):

- every (command, output) pair is what the command prints in a real sandbox of the task, byte
  for byte, across families with folders, setups and files without a final newline;
- contents are never cut short by a line that looks like a section header, and a listing cut by
  the snapshot's budget gives no rows;
- only rows whose span the token budget keeps are sampled, reproducibly.

Run: .venv/bin/python -m pytest -q tests/test_copies.py
"""

from __future__ import annotations

import asyncio
import shutil

import pytest

from obsspec import chat
from obsspec.env.episode import run_scripted
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.suite import builtin_task
from obsspec.worldmodel import snapshot as S
from obsspec.worldmodel.copies import copy_steps, sample_copy_steps

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
SANDBOX = SandboxConfig(timeout_s=10, output_cap=4096)


def snapshot(task) -> str:
    return asyncio.run(S.workspace_text(task, SANDBOX))


@needs_bwrap
@pytest.mark.parametrize("family,index", [("dir-stats", 3), ("find-by-name", 1), ("find-by-size", 1),
                                          ("bulk-rename", 2), ("count-lines", 0)])
def test_each_copy_is_what_the_command_prints_in_the_sandbox(family, index):
    task = builtin_task(family, index)
    text = snapshot(task)
    steps = copy_steps(text)
    kinds = {cmd.split()[0] + (" -l" if cmd.startswith("ls -l") else "") for cmd, _, _ in steps}
    assert {"ls", "ls -l"} <= kinds, steps
    assert ("cat" in kinds) == (S.SECTION.split("{}")[0] in text), "files shown, but no cat rows"
    record = asyncio.run(run_scripted(task, [cmd for cmd, _, _ in steps], SANDBOX, verify=False))
    assert len(record.steps) == len(steps)
    for (cmd, out, _), step in zip(steps, record.steps):
        assert step.command == cmd
        assert chat.format_observation(out, 0, cap=SANDBOX.output_cap) == step.observation, cmd


def render(files: dict[str, str], listing: str) -> str:
    ws = S.Workspace(listing, tuple(S.Entry(p, 0o100644, len(c.encode()), c) for p, c in sorted(files.items())))
    return S.render(ws, "/app")


LISTING = (".:\ntotal 8\n-rw-r--r-- 1 agent agent {a} Jan  1 00:00 a.txt\n"
           "-rw-r--r-- 1 agent agent {b} Jan  1 00:00 b.txt\n")


def test_a_header_inside_contents_does_not_cut_them_short():
    a = "one\n==> b.txt <==\nfake\n"
    files = {"a.txt": a, "b.txt": "tail without newline"}
    steps = {cmd: out for cmd, out, _ in copy_steps(render(files, LISTING.format(a=len(a), b=20)))}
    assert steps["ls -l"].startswith(b"total 8\n") and steps["ls"] == b"a.txt\nb.txt\n"
    assert "cat a.txt" not in steps, "contents split at a look-alike header were kept"
    assert steps["cat b.txt"] == b"tail without newline", "render's added newline was kept"


def test_a_name_a_command_would_misread_gives_no_row():
    listing = (".:\ntotal 8\n-rw-r--r-- 1 agent agent 2 Jan  1 00:00 -rf\n"
               "-rw-r--r-- 1 agent agent 2 Jan  1 00:00 my file\n")
    steps = [cmd for cmd, _, _ in copy_steps(render({"-rf": "x\n", "my file": "y\n"}, listing))]
    assert steps == ["ls -l"], "a name read as an option, or split by the shell, made a row"


def test_a_cut_or_foreign_text_gives_no_rows():
    files = {"a.txt": "x\n", "b.txt": "y\n"}
    text = render(files, LISTING.format(a=2, b=2))
    assert copy_steps(text)
    assert copy_steps(render(files, LISTING.format(a=2, b=2) + S.TRUNCATED.lstrip("\n"))) == []
    assert copy_steps("no snapshot here") == []


def test_sampling_keeps_what_the_budget_keeps_and_is_reproducible():
    files = {"a.txt": "x\n", "b.txt": "y\n"}
    text = render(files, LISTING.format(a=2, b=2))
    kept = text[: text.index("==> b.txt")]
    picked = sample_copy_steps(text, kept, 10, "t1")
    assert {cmd for cmd, _ in picked} == {"ls -l", "ls", "cat a.txt"}
    assert picked == sample_copy_steps(text, kept, 10, "t1")
    assert len(sample_copy_steps(text, text, 2, "t1")) == 2
    assert len(sample_copy_steps(text, text, None, "t1")) == len(copy_steps(text)) == 4
    # a hint's budget: a function of the command and its span says what is shown whole
    picked = sample_copy_steps(text, lambda cmd, span: cmd.startswith("cat"), None, "t1")
    assert sorted(cmd for cmd, _ in picked) == ["cat a.txt", "cat b.txt"]
