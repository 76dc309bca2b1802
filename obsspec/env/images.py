"""Podman images for episode containers: our Debian 12 base and one image per task, built offline.

Built once and shared by every episode that needs them:
- `obsspec-debian:bookworm`, the base: `mmdebstrap --variant=minbase --include=BASE_PACKAGES
  bookworm` imported with `podman import` (there is no registry here; about a minute, once, and
  again when BASE_PACKAGES changes: the image's label `obsspec.packages` records them).
- `FROM debian:bookworm`, `debian:bookworm-slim` and `debian:12*` resolve to that base; any other
  base is a local image, or pulled (`podman pull`, once per process) where a registry answers;
  one that can be had neither way is refused, naming it and the pull's error.
- per task, `obsspec-task:<hash of the build context, workdir and the IDs of the images it
  builds on>` (a rebuilt base gets new task images, never stale ones): the task's Dockerfile plus
  one layer of ours that checks that bash and python3 are there (the supervisor and its janitor
  need them), copies bash to an execute-only file for PID 1 (the kernel makes a process whose
  executable it cannot read non-dumpable: the agent cannot ptrace PID 1) and gives the workdir to
  the agent's uid (the workdir is a tmpfs filled from the image: podman's tmpcopyup).

Every podman command runs through obsspec/env/podman.py (its containers.conf); the containers
themselves are made there too (`podman.argv`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

from obsspec.env import dockerfile
from obsspec.env.podman import (INSTALL_HINT, SUPERVISOR, Environment, PodmanMissing, cache_dir, image_exists,
                                podman)
from obsspec.env.semantics import HARBOR
from obsspec.env.task import file_bytes, file_key
from obsspec.env.podman import say as podman_say

BASE_IMAGE = "obsspec-debian:bookworm"
TASK_REPO = "obsspec-task"
# On top of minbase: the janitor's python3, and the tools the built-in task families' reference
# solutions use beyond coreutils (the bubblewrap sandbox has the host's /usr instead).
BASE_PACKAGES = ("python3", "jq", "bzip2", "xz-utils", "zip", "unzip", "sqlite3")
PACKAGES_LABEL = "obsspec.packages"  # the base image's BASE_PACKAGES: other ones, it is rebuilt
# A build context is text (Task.image_files): this entry of it lists, one a line, the files that
# are executable in the task folder; it is not written into the context, the files it names get
# mode 0755 there (so `COPY run.sh /app/` keeps run.sh runnable).
EXECUTABLES = ".obsspec-executable"
# Harbor semantics: what the harness runs from the image's own (read-only) root, and the label
# that keeps the task's USER.
HARBOR_TOOLS = ("bash", "python3", "mkfifo", "tar", "head", "find")
USER_LABEL = "obsspec.user"
BUILD_TIMEOUT_S = 1800.0
BASE_BUILD_TIMEOUT_S = 900.0
# FROM names that mean our base (Debian 12): with or without a registry prefix.
LOCAL_BASE = re.compile(r"(docker\.io/)?(library/)?debian:(bookworm|bookworm-slim|12(\.\d+)*(-slim)?)")

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class ImageUnavailable(ValueError):
    """A task's image cannot be had here (an unknown base, a failed build): one line, the task's
    problem, not the machine's."""


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


class _FileLock:
    """Held while an image is built, so that two processes never build the same one at once."""

    def __init__(self, name: str):
        self.path = os.path.join(cache_dir(), f"{name}.lock")

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def ensure_base(say=None) -> str:
    """The base image's ID; the image is built when it is missing or holds other packages than
    BASE_PACKAGES (mmdebstrap + podman import, about a minute; task images follow it: task_tag)."""
    say = say or podman_say
    packages = ",".join(BASE_PACKAGES)
    with _lock(BASE_IMAGE), _FileLock("base"):
        # one podman call when the base is there (every episode start makes it)
        found = podman("image", "inspect", "--format", f'{{{{.Id}}}} {{{{index .Labels "{PACKAGES_LABEL}"}}}}',
                       BASE_IMAGE, timeout=60)
        image, _, label = found.stdout.strip().partition(" ")
        if found.returncode == 0 and label == packages:
            return image
        if shutil.which("mmdebstrap") is None:
            raise PodmanMissing(f"building the base image {BASE_IMAGE} needs mmdebstrap: {INSTALL_HINT}")
        why = "its packages changed" if found.returncode == 0 else "about a minute, once"
        say(f"building the base image {BASE_IMAGE} (mmdebstrap minbase + {packages}; {why})")
        t0 = time.monotonic()
        log_path = os.path.join(cache_dir(), "base-build.log")
        with tempfile.TemporaryDirectory(prefix="obsspec-base-") as tmp, open(log_path, "w") as log:
            tar = os.path.join(tmp, "rootfs.tar")
            steps = [["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", tar]]
            for step in steps:
                done = subprocess.run(step, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      timeout=BASE_BUILD_TIMEOUT_S)
                if done.returncode != 0:
                    raise ImageUnavailable(f"building {BASE_IMAGE} failed: {_last_line(log_path)} (log: {log_path})")
            label = ["--change", f"LABEL {PACKAGES_LABEL}={packages}"]
            if podman("import", *label, tar, BASE_IMAGE, timeout=600, log=log).returncode != 0:
                raise ImageUnavailable(f"importing {BASE_IMAGE} failed: {_last_line(log_path)} (log: {log_path})")
        say(f"built {BASE_IMAGE} in {time.monotonic() - t0:.0f} s")
        return image_id(BASE_IMAGE)


def resolve_base(name: str, stages: set[str]) -> str:
    """What a FROM name means here: an earlier stage, our base, a local or pulled image; else refused."""
    if name in stages or name == "scratch":
        return name
    if LOCAL_BASE.fullmatch(name):
        ensure_base()
        return BASE_IMAGE
    problem = unavailable(name)
    if problem:
        raise ImageUnavailable(problem)
    return name


_pulls: dict[str, str] = {}  # image name -> why it could not be pulled ('' = pulled)


def unavailable(name: str) -> str:
    """Why image `name` cannot be had ('' = it is local, or a registry gave it now). Asked once
    per name and process: an import of thousands of tasks on one base asks podman once."""
    if _pulls.get(name):
        return _unavailable_text(name)
    if shutil.which("podman") is not None and image_exists(name):
        return ""
    if shutil.which("podman") is None:
        return f"base image {name} needs podman to be pulled ({INSTALL_HINT})"
    if name not in _pulls:
        done = podman("pull", "--quiet", name, timeout=BUILD_TIMEOUT_S)
        lines = (done.stdout or "").strip().splitlines()
        _pulls[name] = "" if done.returncode == 0 else (lines[-1][:300] if lines else f"exit {done.returncode}")
    return _unavailable_text(name) if _pulls[name] else ""


def _unavailable_text(name: str) -> str:
    why = _pulls[name] if len(_pulls[name]) <= 80 else _pulls[name][:77] + "..."  # (the advice after it
    return (f"base image {name} is not here and could not be pulled ({why}); without a "  # must fit a line)
            f"registry only debian:bookworm, debian:bookworm-slim and debian:12 (built locally as "
            f"{BASE_IMAGE}) or images already in podman can be used")


def from_names(text: str) -> list[tuple[str, str]]:
    """(base, stage name or '') of every FROM instruction, in order (heredoc bodies skipped)."""
    return dockerfile.from_lines(text)


def offline_problem(text: str) -> tuple[str, str]:
    """(kind, why) a Dockerfile cannot be built here (('', '') = it can, as far as its FROM lines
    and heredocs tell): a heredoc we cannot translate (kind 'dockerfile'), a build argument in
    FROM ('dockerfile'), or a base that is neither ours, nor local, nor pulled now from a
    registry ('base-image')."""
    try:
        dockerfile.translate_heredocs(text)
    except dockerfile.Untranslatable as e:
        return "dockerfile", str(e)
    stages: set[str] = set()
    for base, stage in from_names(text):
        if "$" in base:
            return "dockerfile", f"FROM {base} uses a build argument we cannot resolve offline"
        if base not in stages and base != "scratch" and not LOCAL_BASE.fullmatch(base):
            problem = unavailable(base)
            if problem:
                return "base-image", problem
        if stage:
            stages.add(stage)
    return "", ""


def ensure_image(environment: Environment, workdir: str, etc: dict[str, str], say=None) -> str:
    """The image for a task's environment (built once per distinct context, workdir, semantics
    and /etc files of ours: passwd, group, hosts; baked in, so that no host path shows in
    mountinfo). BuildKit heredocs are translated first (obsspec/env/dockerfile.py)."""
    say = say or podman_say
    files = dict(environment.files)
    if "Dockerfile" not in files:
        files = {"Dockerfile": f"FROM {environment.image or 'debian:bookworm'}\n"}
    harbor = environment.semantics == HARBOR
    # (Harbor's layer is in its name: a change to it builds new images, never a stale one)
    layer = _harbor_layer("SRC", "USER", workdir, etc) if harbor else ""
    tag = task_tag(files, workdir, etc, base_ids(files["Dockerfile"]), layer)
    digest = tag.split(":")[1]
    with _lock(tag), _FileLock(f"task-{digest}"):
        if image_exists(tag):
            return tag
        try:
            text, extra = dockerfile.translate_heredocs(files["Dockerfile"])
        except dockerfile.Untranslatable as e:
            raise ImageUnavailable(f"environment/Dockerfile: {e}") from None
        say(f"building image {tag} for {workdir} ({len(files)} context files)")
        t0 = time.monotonic()
        log_path = os.path.join(cache_dir(), f"build-{digest}.log")
        with open(log_path, "w") as log:
            context = {**files, **extra}
            if not harbor:
                _build(tag, _with_our_layer(_resolved(text), workdir, etc), context, etc, log, log_path)
            else:  # the task's own image first: its USER is the agent (our layer says root)
                _build(f"{tag}-src", _resolved(text), context, {}, log, log_path)
                user = image_config(f"{tag}-src")["user"]
                ours = {k: v for k, v in etc.items() if k in ("hostname", "hosts")}  # (its own users)
                _build(tag, _harbor_layer(f"{tag}-src", user, workdir, ours), {}, ours, log, log_path)
        say(f"built {tag} in {time.monotonic() - t0:.0f} s")
        return tag


def _build(tag: str, text: str, files: dict[str, str], etc: dict[str, str], log, log_path: str) -> None:
    """`podman build -t tag` of Dockerfile `text` in a context holding `files` (their modes from
    EXECUTABLES) and our /etc files."""
    with tempfile.TemporaryDirectory(prefix="obsspec-ctx-") as ctx:
        executable = set(files.get(EXECUTABLES, "").splitlines())
        for rel, content in {**files, "Dockerfile": text}.items():
            if rel == EXECUTABLES:
                continue
            path = os.path.join(ctx, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(file_bytes(content))
            os.chmod(path, 0o755 if rel in executable else 0o644)
        for name, content in etc.items():
            with open(os.path.join(ctx, f".obsspec-etc-{name}"), "w") as f:
                f.write(content)
        log.flush()
        done = podman("build", "--pull=never", "--layers", "-t", tag, "-f",
                      os.path.join(ctx, "Dockerfile"), ctx, timeout=BUILD_TIMEOUT_S, log=log)
    if done.returncode != 0:
        raise ImageUnavailable(f"image build failed: {_reason(log_path)} (log: {log_path})")


_configs: dict[str, dict] = {}


def image_config(tag: str) -> dict:
    """What `docker run IMAGE` would do with a built image: its user (our Harbor layer records
    the task's own in a label), entrypoint, cmd, environment and working directory."""
    if tag not in _configs:
        out = podman("image", "inspect", "--format", "{{json .Config}}", tag, timeout=60)
        try:
            config = json.loads(out.stdout) if out.returncode == 0 else None
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise ImageUnavailable(f"cannot read the configuration of image {tag}: {out.stdout.strip()[-200:]}")
        labels = config.get("Labels") or {}
        _configs[tag] = {"user": labels.get(USER_LABEL, config.get("User") or ""),
                         "entrypoint": list(config.get("Entrypoint") or []), "cmd": list(config.get("Cmd") or []),
                         "env": list(config.get("Env") or []), "workdir": config.get("WorkingDir") or "/"}
    return _configs[tag]


def task_tag(files: dict[str, str], workdir: str, etc: dict[str, str], bases: list[str],
             layer: str = "") -> str:
    """The task image's name: a hash of everything it is built from, the IDs of the images it
    builds on included (`bases`), so that a rebuilt base means rebuilt task images. Harbor
    semantics name their layer of ours (`layer`); the isolated images keep their names."""
    parts = (sorted((k, file_key(v)) for k, v in files.items()), workdir, sorted(etc.items()), bases)
    key = repr((*parts, layer) if layer else parts)
    return f"{TASK_REPO}:{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def base_ids(dockerfile: str) -> list[str]:
    """IDs of the images a Dockerfile's FROM lines resolve to (earlier stages and scratch have
    none), building our base first if it is missing."""
    stages: set[str] = set()
    ids = []
    for base, stage in from_names(dockerfile):
        if LOCAL_BASE.fullmatch(base) and base not in stages:
            ids.append(ensure_base())
        elif resolve_base(base, stages) not in stages and base != "scratch":
            ids.append(image_id(base))
        if stage:
            stages.add(stage)
    return ids


def image_id(name: str) -> str:
    """The ID of a local image (`podman image inspect --format {{.Id}}`)."""
    out = podman("image", "inspect", "--format", "{{.Id}}", name, timeout=60)
    if out.returncode != 0 or not out.stdout.strip():
        raise ImageUnavailable(f"cannot read the ID of image {name}: {out.stdout.strip()[-200:]}")
    return out.stdout.strip()


def _resolved(text: str) -> str:
    """The Dockerfile (without heredocs) with every FROM name that means our base replaced by it."""
    stages: set[str] = set()
    out = []
    for ins in dockerfile.instructions(text):
        line = ins.raw
        if ins.keyword == "FROM":
            args = [w for w in ins.args.split() if not w.startswith("--")]
            if args:
                base = resolve_base(args[0], stages)
                if len(args) >= 3 and args[1].upper() == "AS":
                    stages.add(args[2])
                line = line.replace(args[0], base, 1)
        out.append(line)
    return "".join(out).rstrip("\n") + "\n"


def _with_our_layer(dockerfile: str, workdir: str, etc: dict[str, str]) -> str:
    """Our layer on top of the task's last stage (see the module docstring)."""
    check = (
        'for p in bash python3 chown install; do command -v "$p" >/dev/null || '
        '{ echo "obsspec: the image has no $p (the episode supervisor needs bash, python3 and coreutils)"; exit 1; }; done'
    )
    return (dockerfile +
            "USER root\n" +
            "".join(f"COPY .obsspec-etc-{name} /etc/{name}\n" for name in sorted(etc)) +
            f"RUN {check} && install -d -m 0755 /usr/lib/obsspec && "
            f"install -m 0111 \"$(command -v bash)\" {SUPERVISOR} && "
            f"mkdir -p {workdir} && chown -R 1000:1000 {workdir}\n")


def _harbor_layer(src: str, user: str, workdir: str, etc: dict[str, str]) -> str:
    """Our layer for Harbor semantics, on the task's own image `src`: a check for the tools the
    harness runs from the image's pristine root, PID 1's bash at a path of ours, and the task's
    USER as a label (our `USER root` hides it). PID 1 needs no execute-only bash here: it holds
    a capability no agent process has, so none may trace it."""
    check = (
        f'for p in {" ".join(HARBOR_TOOLS)}; do command -v "$p" >/dev/null || '
        '{ echo "obsspec: the image has no $p (harbor semantics need bash, python3 and util-linux)"; exit 1; }; done'
    )
    return (f"FROM {src}\nUSER root\n" +
            "".join(f"COPY .obsspec-etc-{name} /etc/{name}\n" for name in sorted(etc)) +
            f"RUN {check} && install -d -m 0755 /usr/lib/obsspec && "
            f"install -m 0755 \"$(command -v bash)\" {SUPERVISOR} && "
            f"mkdir -p {workdir}\n"
            f"LABEL {USER_LABEL}={json.dumps(user)}\n")


def _reason(log_path: str) -> str:
    with open(log_path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    ours = [line for line in lines if line.startswith("obsspec:")]
    errors = [line for line in lines if line.lower().startswith(("error", "e:"))]
    return (ours or errors or lines or ["(no output)"])[-1][:300]


def _last_line(log_path: str) -> str:
    return _reason(log_path)
