"""The workspace snapshot: what a task's workspace holds before the agent's first command, as a
bounded token prefix ahead of the world model's context (`world_model.workspace_snapshot`).

    ids = await workspace_snapshot(task, fmt, budget=512, sandbox=SandboxConfig())
    snapshots = WorkspaceSnapshots(fmt, 512, sandbox)    # per-task cache: a GRPO group shares one
    prefix = await snapshots.prefix(task)

The published world model sees only the agent's history, so it cannot know what `ls` or `cat`
prints before the agent has looked; the trainer knows the initial workspace. The snapshot is
deterministic: the file tree sorted by path (mode, size in bytes, path), then the contents of
the small text files in the same order, framed as a system turn and cut to the token budget
with a visible marker. It only changes what the world model reads: drafts are still verified
token for token against the real tool, so speculation stays lossless with it on or off.

Where the workspace comes from:
- a task without `setup` (most built-in families): its `files`, exactly as the sandbox writes
  them (files 0644, directories 0755), no sandbox needed;
- a task with `setup` (some built-in families; an imported Harbor suite's `environment/setup.sh`):
  captured in a fresh sandbox after the setup ran, one listing command, then thrown away. A setup
  that fails raises `SandboxError` (loud; inside a rollout the draft fails and the episode goes on).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import stat
from dataclasses import dataclass
from typing import Iterable, Sequence

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


def entries_from_files(files: dict[str, str]) -> list[Entry]:
    """The workspace a setup-less task starts with: its files as `bwrap.tar_files` writes them."""
    out: dict[str, Entry] = {}
    budget = CONTENT_BYTES
    for rel in sorted(files):
        parts = rel.strip("/").split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            out.setdefault(d, Entry(d, stat.S_IFDIR | 0o755, 0))
        data = files[rel].encode("utf-8", "surrogateescape")
        content, budget = _small_text(data, budget)
        out["/".join(parts)] = Entry("/".join(parts), stat.S_IFREG | 0o644, len(data), content)
    return [out[p] for p in sorted(out)]


def _small_text(data: bytes, budget: int) -> tuple[str | None, int]:
    if len(data) > SMALL_FILE_BYTES or len(data) > budget or b"\0" in data:
        return None, budget
    try:
        return data.decode("utf-8"), budget - len(data)
    except UnicodeDecodeError:
        return None, budget


# Runs inside the sandbox, in the workspace, after setup: the same listing as entries_from_files.
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


async def capture_entries(task: Task, sandbox: SandboxConfig) -> list[Entry]:
    """The workspace after `task.setup`, read in a fresh sandbox (then closed)."""
    from obsspec.env.episode import start_sandbox

    # room for the whole listing: the output cap applies to this one command only
    cfg = dataclasses.replace(sandbox, output_cap=max(sandbox.output_cap, 2 * CONTENT_BYTES))
    box = await start_sandbox(task, cfg)
    try:
        result = await box.run(f"python3 -I -c {_shell_quote(_LIST)}")
    finally:
        await box.close()
    if result.exit_code != 0 or result.total_bytes > len(result.output):
        raise SandboxError(f"{task.task_id}: could not list the workspace after setup "
                           f"(exit {result.exit_code}): {result.output[-300:].decode(errors='replace')}")
    rows = json.loads(result.output.decode("utf-8"))
    return [Entry(r["path"], r["mode"], r["size"], r.get("content"), r.get("target", "")) for r in rows]


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


async def workspace_entries(task: Task, sandbox: SandboxConfig) -> list[Entry]:
    return await capture_entries(task, sandbox) if task.setup.strip() else entries_from_files(task.files)


# ---------------------------------------------------------------------------------------------
# Text and token ids


def render(entries: Sequence[Entry], workdir: str) -> str:
    """The snapshot as text: the tree, then the small files' contents (both sorted by path)."""
    lines = [f"Files in {workdir} before the first command (mode, size in bytes, path):"]
    for e in entries:
        name = e.path + ("/" if stat.S_ISDIR(e.mode) else "") + (f" -> {e.target}" if e.target else "")
        size = "-" if stat.S_ISDIR(e.mode) else e.size
        lines.append(f"{stat.filemode(e.mode)} {size:>8} {name}")
    if not entries:
        lines.append("(empty)")
    text = "\n".join(lines) + "\n"
    for e in entries:
        if e.content is not None:
            text += f"\n==> {e.path} <==\n{e.content}"
            text += "" if e.content.endswith("\n") or not e.content else "\n"
    return text


def snapshot_ids(fmt, text: str, budget: int) -> list[int]:
    """`text` framed as a system turn, at most `budget` tokens: cut with a visible marker."""
    open_ids, close_ids, body = fmt.encode(OPEN), fmt.encode(CLOSE), fmt.encode(text)
    room = budget - len(open_ids) - len(close_ids)
    if len(body) > room:
        marker = fmt.encode(TRUNCATED)
        if room < len(marker):
            raise ValueError(f"a workspace snapshot needs more than {budget} tokens for its frame alone")
        body = body[: room - len(marker)] + marker
    return open_ids + body + close_ids


async def workspace_snapshot(task: Task, fmt, budget: int, sandbox: SandboxConfig) -> list[int]:
    """The task's workspace snapshot as token ids, at most `budget` of them."""
    return snapshot_ids(fmt, render(await workspace_entries(task, sandbox), task.workdir), budget)


class WorkspaceSnapshots:
    """Snapshots by task (content hash), each built once: every episode of a task, and so every
    member of a GRPO group, gets the same prefix ids. Tasks seen are remembered by id, so that
    training rows of their trajectories (`prefixes`) get the prefix the drafts had."""

    def __init__(self, fmt, budget: int, sandbox: SandboxConfig):
        self.fmt, self.budget, self.sandbox = fmt, budget, sandbox
        self._ids: dict[str, list[int]] = {}
        self._building: dict[str, asyncio.Future] = {}
        self._tasks: dict[str, Task] = {}

    async def prefix(self, task: Task) -> list[int]:
        key = task.content_hash()
        self._tasks[task.task_id] = task
        if key in self._ids:
            return self._ids[key]
        fut = self._building.get(key)
        if fut is None or fut.get_loop() is not asyncio.get_running_loop():
            # concurrent episodes of one task wait for one build (which a cancelled draft
            # leaves running for the others)
            fut = self._building[key] = asyncio.ensure_future(
                workspace_snapshot(task, self.fmt, self.budget, self.sandbox))
        try:
            ids = await asyncio.shield(fut)
        except BaseException:
            if fut.done():  # failed: the next request tries again
                self._building.pop(key, None)
            raise
        self._ids[key] = ids
        self._building.pop(key, None)
        return ids

    def remember(self, task: Task) -> None:
        self._tasks.setdefault(task.task_id, task)

    def prefixes(self, trajectories: Iterable) -> list[list[int]]:
        """The prefix of each trajectory's task (by `task_id`), building the missing ones; for
        `warmstart.trajectory_examples(..., prefixes=...)`. Call it outside an event loop."""
        trajectories = list(trajectories)
        # (an episode that never ran a command was never seen, and has no target either)
        missing = [tr.task_id for tr in trajectories if tr.task_id not in self._tasks and any(tr.wm_mask)]
        if missing:
            raise KeyError(f"no task known for trajectory task_id {missing[0]!r}")
        table = asyncio.run(self.table([self._tasks[tr.task_id] for tr in trajectories
                                        if tr.task_id in self._tasks]))
        return [table.get(tr.task_id, []) for tr in trajectories]

    async def table(self, tasks: Iterable[Task]) -> dict[str, list[int]]:
        """task_id -> prefix ids for `tasks` (built a few at a time)."""
        gate = asyncio.Semaphore(4)

        async def one(task: Task) -> tuple[str, list[int]]:
            async with gate:
                return task.task_id, await self.prefix(task)

        return dict(await asyncio.gather(*(one(t) for t in {t.task_id: t for t in tasks}.values())))
