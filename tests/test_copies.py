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


@needs_bwrap
@pytest.mark.parametrize("family,index", [("dir-stats", 3), ("bulk-rename", 2), ("organize-files", 1)])
def test_a_listing_row_copies_a_folder_as_the_sandbox_lists_it_from_a_snapshot_of_that_folder_alone(family, index):
    """`listing_rows`: per top-level folder, a snapshot turn holding that folder's line and block
    alone, the call `ls -l DIR`, and as target what the sandbox prints (formatted as it would)."""
    from transformers import AutoTokenizer

    from obsspec.tokens import ChatFormat
    from obsspec.worldmodel.copies import listing_rows, top_listings

    task = builtin_task(family, index)
    text = snapshot(task)
    listings = top_listings(text)
    assert listings, "no top-level folder to list"
    fmt = ChatFormat(AutoTokenizer.from_pretrained("obsspec/bases/tiny-cpu/tokenizer"))
    rows = listing_rows(fmt, text, SANDBOX.output_cap)
    assert len(rows) == len(listings)
    script = [f"ls -l {folder}" for folder, _, _ in listings]
    record = asyncio.run(run_scripted(task, script, SANDBOX, verify=False))
    for (folder, line, body), row, step in zip(listings, rows, record.steps):
        assert line.startswith("drwx") and line.endswith(f" {folder}") and f"\n{line}\n" in text
        ids, mask = row["input_ids"], row["completion_mask"]
        start = mask.index(1)
        assert mask[start:] == [1] * (len(mask) - start), "the loss is on the observation alone"
        target = fmt.decode(ids[start:])
        assert step.command == f"ls -l {folder}"
        assert target == step.observation + chat.OBS_CLOSE
        prompt = fmt.decode(ids[:start])
        assert prompt.count("<workspace>") == 1 and f"./{folder}:\n{body}</workspace>" in prompt
        assert "<|im_start|>user" not in prompt.split("</tool_call>")[0], "no task prompt"
        others = [f for f, _, _ in listings if f != folder]
        assert not any(f"./{f}:" in prompt for f in others), "another folder's listing in the snapshot"
    assert listing_rows(fmt, "no snapshot here", 4096) == []
