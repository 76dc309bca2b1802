"""What a terminal task is: instruction, setup, verifier and reference solution.

A `Task` is plain data (JSON-serialisable) so that task suites can be written to JSONL, read back
with `datasets.load_dataset("json", ...)`, and rebuilt into the same object.

Conventions every task follows:
- `files` are written into the workspace (paths relative to it) before `setup` runs; both happen
  before the agent's first command, and every file they leave gets the same fixed timestamp.
- `setup` and every agent command run with the workspace (`workdir`, default /app) as cwd.
- `verify` is a bash script run after the episode, in the same sandbox, with `verify_files`
  placed under /tests (invisible to the agent during the episode). The reward is the number the
  script writes to /logs/verifier/reward.txt (Harbor's convention), else 1.0 on exit code 0 and
  0.0 otherwise. Rewards are clipped to [0, 1]. It may run `verify_timeout_s` seconds (a Harbor
  task's `[verifier] timeout_sec`; 0 = the sandbox's default, 4 x its command timeout).
- `solution` is the reference solution: a list of bash commands, one per agent turn.
- `image_files` (optional) is a container build context holding a `Dockerfile` (a Harbor task's
  environment/), or `image` names an image to use as it is: the task then runs in a Podman
  container of that image (obsspec/env/podman.py, images.py), with `resources` (cpus, memory_mb,
  storage_mb, internet) as its limits. Tasks without them run in the recipe's sandbox backend.
- `kind` (optional) names the family's variant of the task (dir-stats: which number is asked);
  training interleaves kinds so every part of a run sees the same mix, and reports success per kind.
- A file's content (`files`, `verify_files`, `image_files`) is text, or a `Blob`: a binary or
  large file (an imported task's image, database, archive), kept out of the JSON as its sha256 and
  size, its bytes in the suite's `blobs/` (obsspec/env/suite.py); the hash is the task's, so a
  suite is reproducible, and a blob whose bytes differ is refused when it is read.
- `semantics` (optional) is how the task's terminal behaves (obsspec/env/semantics.py): '' is
  `isolated` (the built-in families); `harbor` (imported tasks) runs in a container as Harbor
  runs it: services live on, root in the container, one HOME and the real clock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import posixpath
import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from obsspec.env.semantics import HARBOR, ISOLATED, check as check_semantics

# A workspace cannot be (or be under) these: system dirs bound read-only, the sandbox's own mounts.
RESERVED_DIRS = ("/usr", "/etc", "/proc", "/dev", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                 "/tests", "/logs", "/tmp", "/run", "/home/agent")
# Task ids name files and run directories: no separators, no dot-names, nothing a shell mangles.
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,199}")


def check_workdir(workdir: str) -> None:
    path = posixpath.normpath(workdir) if workdir.startswith("/") else ""
    if (path in ("", "/") or any(path == d or path.startswith(d + "/") for d in RESERVED_DIRS)
            or any(ord(c) < 32 or c == "\x7f" for c in workdir)):
        raise ValueError(f"task workdir must be an absolute, non-system path, not {workdir!r}")


def check_relative(path: str) -> None:
    """A task file's path: relative, inside the directory it is written to."""
    norm = posixpath.normpath(path)
    if "\0" in path or norm.startswith("/") or norm == "." or norm.split("/")[0] == "..":
        raise ValueError(f"task file path must stay inside its directory, not {path!r}")


class Blob(NamedTuple):
    """A task file's content kept out of the suite's JSON: its sha256, its size, and where its
    bytes lie (the task folder it was imported from, or the suite's blobs/ folder)."""

    sha256: str
    size: int
    path: str = ""

    def read(self) -> bytes:
        if not self.path:
            raise ValueError(f"task file {self.sha256[:12]}: no blobs/ folder holds its content "
                             "(tasks with binary files are read from their prepared suite)")
        try:
            with open(self.path, "rb") as f:
                data = f.read(self.size + 1)
        except OSError as e:
            raise ValueError(f"task file {self.sha256[:12]}: cannot read {self.path}: {e.strerror}") from None
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.sha256:
            raise ValueError(f"task file {self.sha256[:12]}: {self.path} is not the task's content "
                             "(changed since the suite was prepared)")
        return data

    def to_json(self) -> dict:
        return {"sha256": self.sha256, "size": self.size}

    @classmethod
    def of(cls, path: str) -> "Blob":
        """The blob of a file on disk (read once, in chunks, for its hash)."""
        digest, size = hashlib.sha256(), 0
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        return cls(digest.hexdigest(), size, os.path.abspath(path))


FileContent = str | Blob


def file_bytes(content: FileContent | bytes) -> bytes:
    """A task file's bytes (text as UTF-8; a blob read and checked against its hash)."""
    if isinstance(content, Blob):
        return content.read()
    return content if isinstance(content, bytes) else content.encode("utf-8", "surrogateescape")


def file_key(content: FileContent | bytes) -> str:
    """What identifies a file's content in a hash (a blob by its sha256, never by where it lies;
    bytes as the blob they would be)."""
    if isinstance(content, bytes):
        return f"blob:sha256:{hashlib.sha256(content).hexdigest()}"
    return f"blob:sha256:{content.sha256}" if isinstance(content, Blob) else content


def shipped(files: dict) -> dict:
    """`files` with every blob's bytes read (to send to another machine, where its path is not)."""
    return {k: v.read() if isinstance(v, Blob) else v for k, v in files.items()}


def texts(files: dict[str, FileContent]) -> list[str]:
    """The text files' contents (what a word heuristic on a task's tests reads)."""
    return [v for v in files.values() if isinstance(v, str)]


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    instruction: str
    solution: list[str]
    verify: str
    files: dict[str, FileContent] = field(default_factory=dict)
    setup: str = ""
    verify_files: dict[str, FileContent] = field(default_factory=dict)
    workdir: str = "/app"
    max_turns: int = 12
    source: str = "builtin"
    kind: str = ""
    verify_timeout_s: float = 0.0
    image: str = ""
    image_files: dict[str, FileContent] = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    semantics: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.task_id, str) or not TASK_ID.fullmatch(self.task_id):
            raise ValueError(f"task id must be letters, digits and . _ : + - (not starting with one "
                             f"of those), not {self.task_id!r:.60}")
        check_workdir(self.workdir)
        for path in (*self.files, *self.verify_files, *self.image_files):
            check_relative(path)
        if self.image_files and "Dockerfile" not in self.image_files:
            raise ValueError("a task's image_files must hold a Dockerfile (the build context's)")
        for key, value in self.resources.items():
            if key not in RESOURCES or not RESOURCES[key](value):
                raise ValueError(f"task resources: {key}={value!r:.40} is not one of {', '.join(RESOURCES)} "
                                 "(cpus, memory_mb, storage_mb: positive numbers; internet: true/false)")
        if self.semantics:  # ('' is isolated; naming it would change the suite's hashes)
            check_semantics(self.semantics)
            if self.semantics == ISOLATED:
                raise ValueError("task semantics 'isolated' is written as '' (the default)")
        strings = [self.instruction, self.setup, self.verify, *self.solution,
                   *texts(self.files), *texts(self.verify_files), *texts(self.image_files), self.image]
        if any("\0" in t for t in strings):
            raise ValueError("task text cannot contain a NUL byte (no shell could read it)")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name in ("files", "verify_files", "image_files"):
            d[name] = {k: v.to_json() if isinstance(v, Blob) else v for k, v in d[name].items()}
        if not d["verify_timeout_s"]:  # absent when unset: the suites and hashes of tasks without it
            del d["verify_timeout_s"]  # stay byte for byte what they were
        for name in ("image", "image_files", "resources", "semantics"):  # the same for these
            if not d[name]:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        """The task a `to_dict` wrote; a field of the wrong type (a hand-written suite line) is a
        ValueError naming it, not a task that fails later in a sandbox or a sort."""
        if not isinstance(d, dict):
            raise ValueError(f"a task is a JSON object, not {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown task fields: {sorted(unknown)}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in d and f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
        if missing:
            raise ValueError(f"task fields missing: {missing}")
        for name, value in d.items():
            if not _TYPES[name](value):
                raise ValueError(f"task field {name!r} must be {_TYPE_NAMES[name]}, got {value!r:.60}")
        d = dict(d)
        for name in ("files", "verify_files", "image_files"):
            if name in d:
                d[name] = {k: Blob(v["sha256"], v["size"]) if isinstance(v, dict) else v for k, v in d[name].items()}
        d["solution"] = list(d.get("solution", []))
        if "verify_timeout_s" in d:
            d["verify_timeout_s"] = float(d["verify_timeout_s"])
        return cls(**d)

    @property
    def blobs(self) -> list[Blob]:
        """Every file of the task kept as a blob."""
        return [v for files in (self.files, self.verify_files, self.image_files) for v in files.values()
                if isinstance(v, Blob)]

    def with_blobs_in(self, folder: str) -> "Task":
        """This task with its blobs' bytes read from `folder` (a suite's blobs/, named by sha256)."""
        if not self.blobs:
            return self
        def at(files):
            return {k: v._replace(path=os.path.join(folder, v.sha256)) if isinstance(v, Blob) else v
                    for k, v in files.items()}
        return dataclasses.replace(self, files=at(self.files), verify_files=at(self.verify_files),
                                   image_files=at(self.image_files))

    @property
    def needs_image(self) -> bool:
        """Does the task run in a container of its own image (not the recipe's backend)?"""
        return bool(self.image or self.image_files)

    @property
    def harbor(self) -> bool:
        """Does the task run with Harbor semantics (always in a container)?"""
        return self.semantics == HARBOR

    @property
    def reward_file(self) -> bool:
        """Does the verifier report through /logs/verifier/reward.txt (Harbor's convention: its
        tests name reward.txt or reward.json)? Then no reward file is 0, whatever test.sh exited
        with: code of the agent's that the tests ran could have removed it. Built-in verifiers,
        and imported tests that never name the file, report by exit status."""
        return self.source.startswith("harbor:") and any(
            "reward.txt" in text or "reward.json" in text for text in texts(self.verify_files))

    def content_hash(self) -> str:
        """sha256 of the canonical JSON form: equal hashes mean equal tasks."""
        blob = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest()


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


RESOURCES = {"cpus": _positive, "memory_mb": _positive, "storage_mb": _positive,
             "internet": lambda v: isinstance(v, bool)}


SHA256 = re.compile(r"[0-9a-f]{64}")


def _is_blob_json(x) -> bool:
    return (isinstance(x, dict) and set(x) == {"sha256", "size"} and isinstance(x["sha256"], str)
            and bool(SHA256.fullmatch(x["sha256"])) and isinstance(x["size"], int)
            and not isinstance(x["size"], bool) and x["size"] >= 0)


def _is_file_map(v) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and (isinstance(x, str) or _is_blob_json(x))
                                       for k, x in v.items())


_FILES = "an object of texts or {sha256, size} blobs"
_TYPE_NAMES = {"solution": "a list of strings", "files": _FILES,
               "verify_files": _FILES, "max_turns": "a positive integer",
               "verify_timeout_s": "a number of seconds >= 0", "image_files": _FILES,
               "resources": "an object"}
_TYPES = {name: lambda v: isinstance(v, str) for name in
          ("task_id", "family", "instruction", "verify", "setup", "workdir", "source", "kind", "semantics")}
_TYPE_NAMES.update({name: "a string" for name in _TYPES})
_TYPES.update({
    "solution": lambda v: isinstance(v, list) and all(isinstance(c, str) for c in v),
    "files": _is_file_map, "verify_files": _is_file_map, "image_files": _is_file_map,
    "image": lambda v: isinstance(v, str), "resources": lambda v: isinstance(v, dict),
    "max_turns": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "verify_timeout_s": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    and math.isfinite(v) and v >= 0,
})
