"""The workspace snapshot: what a task's workspace holds before the agent's first command, as a
bounded token prefix ahead of the world model's context (`world_model.workspace_snapshot`).

    ids = await workspace_snapshot(task, fmt, budget=512, sandbox=SandboxConfig())
    # each task's view (snapshot and hints), built once: obsspec/worldmodel/views.py

The published world model sees only the agent's history, so it cannot know what `ls` or `cat`
prints before the agent has looked; the trainer knows the initial workspace. The snapshot shows
it the way the agent's terminal would: `ls -lR` run in a fresh sandbox of the task (after its
setup, at the logical time of the first command), then the contents of the small text files in
path order, framed as a system turn and cut to the token budget with a visible marker. What the
agent's `ls -l DIR` or `cat FILE` prints is then a span of the prompt, byte for byte, for a world
model to copy rather than re-format. Deterministic (the sandbox's pinned clock, owners and
locale). It only changes what the world model reads: drafts are still verified token for token
against the real tool, so speculation stays lossless with it on or off. A setup that fails
raises `SandboxError` (loud; inside a rollout the draft fails and the episode goes on).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from typing import Iterable

from obsspec.env.sandbox import SandboxConfig, SandboxError
from obsspec.env.task import Task
from obsspec.tokens import IM_END, IM_START

SMALL_FILE_BYTES = 4096          # files up to this size have their contents shown (if text)
CONTENT_BYTES = 128 * 1024       # contents listed at most (far beyond any token budget allowed)
MIN_TOKENS, MAX_TOKENS = 64, 32768
OPEN = f"{IM_START}system\n<workspace>\n"
CLOSE = f"</workspace>{IM_END}\n"
TRUNCATED = "\n[truncated]\n"


@dataclass(frozen=True)
class Entry:
    path: str                  # relative to the workspace; directories end without a slash
    mode: int                  # st_mode (file type and permission bits)
    size: int                  # bytes (0 for directories)
    content: str | None = None  # small text files only
    target: str = ""           # symlinks: where they point


# ---------------------------------------------------------------------------------------------
# The workspace of a task


# Runs inside the sandbox, in the workspace, after setup: every path, with small text files' contents.
_LIST = f"""
import json, os, stat
SMALL, budget, out = {SMALL_FILE_BYTES}, {CONTENT_BYTES}, []
for root, dirs, files in os.walk("."):
    dirs.sort()
    for name in sorted(dirs + files):
        p = os.path.join(root, name)[2:]
        st = os.lstat(p)
        e = {{"path": p, "mode": st.st_mode, "size": 0 if stat.S_ISDIR(st.st_mode) else st.st_size}}
        if stat.S_ISLNK(st.st_mode):
            e["target"] = os.readlink(p)
        elif stat.S_ISREG(st.st_mode) and st.st_size <= min(SMALL, budget):
            data = open(p, "rb").read()
            try:
                if b"\\0" not in data:
                    e["content"] = data.decode("utf-8")
                    budget -= len(data)
            except UnicodeDecodeError:
                pass
        out.append(e)
print(json.dumps(sorted(out, key=lambda e: e["path"])))
"""


@dataclass(frozen=True)
class Workspace:
    """A task's workspace before the first command, as the agent's terminal would show it."""

    listing: str                # `ls -lR` run in the workspace, exactly as the sandbox prints it
    entries: tuple[Entry, ...]  # every path, with the small text files' contents


LISTING = "ls -lR"
HEADER = "{} before the first command:\n$ " + LISTING + "\n"  # the snapshot's first lines (`render`): the workdir
SECTION = "\n==> {} <==\n"        # ahead of a small file's contents in the snapshot's text (`render`)
LISTING_BYTES = 64 * 1024        # listing kept at most (far beyond any token budget allowed)


async def capture_workspace(task: Task, sandbox: SandboxConfig) -> Workspace:
    """The workspace after `task.setup` (if any), read in a fresh sandbox (then closed): the
    listing first, at the logical time of the agent's first command, so that its modes, sizes,
    owners and pinned dates are what an `ls -l` of the agent prints."""
    from obsspec.env.episode import start_sandbox

    # room for the whole listing: the output cap applies to these commands only
    cfg = dataclasses.replace(sandbox, output_cap=max(sandbox.output_cap, 2 * CONTENT_BYTES))
    box = await start_sandbox(task, cfg)
    try:
        listing = await box.run(LISTING)
        result = await box.run(f"python3 -I -c {_shell_quote(_LIST)}")
    finally:
        await box.close()
    if listing.exit_code != 0 or result.exit_code != 0 or result.total_bytes > len(result.output):
        bad = listing if listing.exit_code != 0 else result
        raise SandboxError(f"{task.task_id}: could not list the workspace after setup "
                           f"(exit {bad.exit_code}): {bad.output[-300:].decode(errors='replace')}")
    rows = json.loads(result.output.decode("utf-8"))
    text = listing.output[:LISTING_BYTES].decode("utf-8", "replace")
    if listing.total_bytes > LISTING_BYTES:
        text = text[: text.rfind("\n") + 1] + TRUNCATED.lstrip("\n")
    return Workspace(text, tuple(Entry(r["path"], r["mode"], r["size"], r.get("content"), r.get("target", ""))
                                 for r in rows))


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# ---------------------------------------------------------------------------------------------
# Text and token ids


def render(workspace: Workspace, workdir: str) -> str:
    """The snapshot as text: the `ls -lR` listing as the terminal prints it, then the small text
    files' contents in path order. A world model that copies can then write what `ls -l DIR` or
    `cat FILE` prints from a span of its prompt: the listing is the sandbox's own output, not a
    paraphrase it would have to re-format (column padding, owners, dates, `total` lines)."""
    text = HEADER.format(workdir) + workspace.listing
    for e in workspace.entries:
        if e.content is not None:
            text += SECTION.format(e.path) + e.content
            text += "" if e.content.endswith("\n") or not e.content else "\n"
    return text


def snapshot_ids(fmt, text: str, budget: int) -> list[int]:
    """`text` framed as a system turn, at most `budget` tokens: cut with a visible marker."""
    open_ids, close_ids, body = fmt.encode(OPEN), fmt.encode(CLOSE), fmt.encode_text(text)
    room = budget - len(open_ids) - len(close_ids)
    if len(body) > room:
        marker = fmt.encode(TRUNCATED)
        if room < len(marker):
            raise ValueError(f"a workspace snapshot needs more than {budget} tokens for its frame alone")
        body = body[: room - len(marker)] + marker
    return open_ids + body + close_ids


async def workspace_text(task: Task, sandbox: SandboxConfig) -> str:
    """The task's workspace snapshot as text (`render`), before any tokenizer exists."""
    return render(await capture_workspace(task, sandbox), task.workdir)


async def workspace_texts(tasks: Iterable[Task], sandbox: SandboxConfig, workers: int = 4) -> dict[str, str]:
    """task_id -> `workspace_text` for `tasks`, `workers` sandboxes at a time."""
    return await by_task(tasks, workers, lambda task: workspace_text(task, sandbox))


async def by_task(tasks: Iterable[Task], workers: int, build) -> dict:
    """task_id -> `await build(task)` for each task (by id, once), `workers` at a time."""
    gate = asyncio.Semaphore(workers)

    async def one(task: Task) -> tuple:
        async with gate:
            return task.task_id, await build(task)

    return dict(await asyncio.gather(*(one(t) for t in {t.task_id: t for t in tasks}.values())))


async def workspace_snapshot(task: Task, fmt, budget: int, sandbox: SandboxConfig) -> list[int]:
    """The task's workspace snapshot as token ids, at most `budget` of them."""
    return snapshot_ids(fmt, await workspace_text(task, sandbox), budget)
