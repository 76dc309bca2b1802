"""Copy rows: commands whose whole output is a span of the task's workspace snapshot, for a
world model to learn copying before it learns the suite's rows (`kit.copy_steps`).

    steps = copy_steps(snapshot_text)
    # [("ls -l data", b"total 8\\n-rw-r--r-- ...", "./data:\\ntotal 8\\n..."), ("cat data/a.txt", b"...", ...)]

What `ls -l DIR`, `ls DIR`, `cat FILE` and `head -N FILE` print right after setup is already in
the snapshot (obsspec/worldmodel/snapshot.py `render`): each directory's block of the `ls -lR`
listing, and each small text file's contents. `copy_steps` reads those spans back out of the
rendered text, so a kit can make thousands of exact (command -> output) rows without a sandbox.
A file's contents are used only when their byte count equals the size its listing line shows
(a file whose text looks like a section header cannot cut another's contents short), and a name
a shell would need quoted is left out. tests/test_copies.py runs the commands in real sandboxes
and checks the outputs byte for byte.

`listing_rows` lays out the listing stage's rows (`kit.listing_steps`): each top-level folder's
`ls -l`, with a snapshot of that folder alone and no task prompt.
"""

from __future__ import annotations

import random
import re

from obsspec import chat
from obsspec.tokens import IM_START, transcript, wm_row
from obsspec.worldmodel.snapshot import CLOSE, HEADER, LISTING, OPEN, SECTION, TRUNCATED

# One line of `ls -l` in the sandbox (C locale, pinned clock): mode, links, owner, group, size,
# date, name (`name -> target` for a symlink).
_LINE = re.compile(r"^(?P<mode>[-dlcbps][-rwxsStT]{9}) +\d+ \S+ +\S+ +(?P<size>\d+) "
                   r"[A-Z][a-z]{2} [ \d]\d +(?:\d\d:\d\d|\d{4}) (?P<name>.+)$")
_SECTION = re.compile("(.+?)".join(map(re.escape, SECTION.split("{}"))))
_PLAIN = re.compile(r"[A-Za-z0-9._+][A-Za-z0-9._/+-]*")  # a path no shell quoting changes, not an option
HEAD_LINES = (3, 5)


def copy_steps(text: str) -> list[tuple[str, bytes, str]]:
    """(command, output, span) triples whose output the rendered snapshot `text` holds byte for
    byte, in `span` (the directory's block, or the file's section with its header):
    `ls -l DIR` and `ls DIR` per directory of the listing (`ls -l` and `ls` for the top one),
    `cat FILE` and `head -N FILE` per file shown. Empty for a text not in `render`'s layout."""
    steps: list[tuple[str, bytes, str]] = []
    folders, files = _parse(text)
    for folder, (span, body, names) in folders.items():
        target = f" {folder}" if folder else ""
        steps.append((f"ls -l{target}", body.encode(), span))
        if all(_PLAIN.fullmatch(n) for n in names):
            steps.append((f"ls{target}", "".join(n + "\n" for n in names).encode(), span))
    for path, (span, data) in files.items():
        steps.append((f"cat {path}", data, span))
        n = HEAD_LINES[len(path) % len(HEAD_LINES)]
        if data.count(b"\n") > n:
            steps.append((f"head -{n} {path}", b"".join(data.splitlines(keepends=True)[:n]), span))
    return steps


def spans(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """The rendered snapshot `text` by path: (folder -> its block of the `ls -lR` listing, "" for
    the top one; file -> its section, header and contents). Only what `copy_steps` trusts: both
    empty for a text not in `render`'s layout or with a cut listing."""
    folders, files = _parse(text)
    return {k: v[0] for k, v in folders.items()}, {k: v[0] for k, v in files.items()}


def top_listings(text: str) -> list[tuple[str, str, str]]:
    """(folder, its line in the top folder's listing, what `ls -l folder` prints) for each
    top-level folder of the rendered snapshot `text` whose listing `copy_steps` trusts."""
    folders, _ = _parse(text)
    if "" not in folders:
        return []
    out = []
    for line in folders[""][1].splitlines()[1:]:
        m = _LINE.match(line)
        if m and m["mode"].startswith("d") and m["name"] in folders:
            out.append((m["name"], line, folders[m["name"]][1]))
    return out


def listing_snapshot(workdir: str, folder: str, line: str, body: str) -> str:
    """The snapshot turn of a workspace holding only `folder` (`line`: its line in `ls -l`;
    `body`: what `ls -l folder` prints), in `render`'s layout."""
    return f"{OPEN}{HEADER.format(workdir)}.:\ntotal 0\n{line}\n\n./{folder}:\n{body}{CLOSE}"


def listing_rows(fmt, text: str, cap: int) -> list[dict]:
    """The listing stage's world-model rows of one workspace (`kit.listing_steps`): per top-level
    folder, a snapshot turn holding only that folder's listing, the call `ls -l folder`, and its
    observation as the sandbox formats it (the target). No task prompt: nothing but the listing
    to copy from, which is how the tiny world model first learns to copy names it has never seen
    (docs/WORLDMODEL.md, "Copying listings")."""
    workdir = text.partition(HEADER.format(""))[0]
    rows = []
    for folder, line, body in top_listings(text):
        ids = (fmt.encode(listing_snapshot(workdir, folder, line, body)) + fmt.encode(f"{IM_START}assistant\n")
               + fmt.action_ids(chat.render_bash(f"ls -l {folder}")) + fmt.obs_prefix_ids)
        target = fmt.wm_target_ids(chat.format_observation(body.encode(), 0, cap=cap))
        rows.append({"input_ids": ids + target, "completion_mask": [0] * len(ids) + [1] * len(target)})
    return rows


def _parse(text: str) -> tuple[dict[str, tuple[str, str, list[str]]], dict[str, tuple[str, bytes]]]:
    """(folder -> (span, `ls -l` body, names), file -> (span, contents as `cat` prints them))."""
    _, sep, rest = text.partition(f"\n$ {LISTING}\n")
    if not sep:
        return {}, {}
    parts = _SECTION.split(rest)
    listing, sections = parts[0], list(zip(parts[1::2], parts[2::2]))
    if listing.endswith(TRUNCATED.lstrip("\n")):
        return {}, {}
    folders: dict[str, tuple[str, str, list[str]]] = {}
    sizes: dict[str, int] = {}
    for block in listing.split("\n\n"):
        header, _, body = block.partition(":\n")
        if header != "." and not header.startswith("./"):
            continue
        folder = header[2:]
        if folder and not _PLAIN.fullmatch(folder):
            continue
        lines = body.rstrip("\n").split("\n")
        if not lines or not lines[0].startswith("total "):
            continue
        parsed = [_LINE.match(line) for line in lines[1:]]
        if not all(parsed):
            continue
        names = []
        for m in parsed:
            name = m["name"].split(" -> ")[0] if m["mode"].startswith("l") else m["name"]
            names.append(name)
            if m["mode"].startswith("-"):
                sizes[f"{folder}/{name}" if folder else name] = int(m["size"])
        body = body.rstrip("\n") + "\n"
        folders[folder] = (f"{header}:\n{body}", body, names)
    files: dict[str, tuple[str, bytes]] = {}
    for path, raw in sections:
        data = raw.encode()
        size = sizes.get(path)
        if size is None or not _PLAIN.fullmatch(path):
            continue
        if len(data) != size:  # render adds a newline to contents without one
            if not (raw.endswith("\n") and len(data) - 1 == size):
                continue
            data = data[:-1]
        files[path] = (SECTION.format(path).lstrip("\n") + raw, data)
    return folders, files


def sample_copy_steps(text: str, kept, limit: int | None, seed: str) -> list[tuple[str, bytes]]:
    """At most `limit` (None: all) (command, output) pairs of `copy_steps(text)` whose span is
    shown whole: lies in `kept` (the part of the snapshot a token budget keeps), or, when `kept`
    is a function of (command, span), where it says so (a hint's budget); drawn reproducibly
    from `seed`."""
    shown = kept if callable(kept) else (lambda command, span: span in kept)
    steps = [(cmd, out) for cmd, out, span in copy_steps(text) if shown(cmd, span)]
    random.Random(seed).shuffle(steps)
    return steps[:limit]


def copy_row(fmt, snapshot_ids, instruction: str, command: str, output: bytes, cap: int) -> tuple[dict, str]:
    """One copy step as a world-model row (`wm_row`: the snapshot, the task's prompt, the call,
    then the observation as the sandbox formats it, its body the target), and that body."""
    body = chat.format_observation(output, 0, cap=cap)
    t = transcript(fmt, instruction, [(command, body)], done=False)
    return wm_row(snapshot_ids, t.ids, t.wm_mask), body
