"""How an episode's Podman container is built: its images, command line, mounts and environment.

A task whose environment is a container image (a Harbor `environment/Dockerfile`, or
`[environment] docker_image`) runs in a Podman container with the same episode contract as the
bubblewrap sandbox: PID 1 is obsspec's supervisor (scripts/supervisor.sh), fed on stdin, and the
harness (obsspec/env/sandbox.py) speaks the same protocol to it. Only the command line differs.

Images, built once and shared by every episode that needs them:
- `obsspec-debian:bookworm`, the base: `mmdebstrap --variant=minbase --include=BASE_PACKAGES
  bookworm` imported with `podman import` (there is no registry here; about a minute, once, and
  again when BASE_PACKAGES changes: the image's label `obsspec.packages` records them).
- `FROM debian:bookworm`, `debian:bookworm-slim` and `debian:12*` resolve to that base; any other
  base must already be a local image (a task that names one that is not is refused, naming it).
- per task, `obsspec-task:<hash of the build context, workdir and the IDs of the images it
  builds on>` (a rebuilt base gets new task images, never stale ones): the task's Dockerfile plus
  one layer of ours that checks that bash and python3 are there (the supervisor and its janitor
  need them), copies bash to an execute-only file for PID 1 (the kernel makes a process whose
  executable it cannot read non-dumpable: the agent cannot ptrace PID 1) and gives the workdir to
  the agent's uid (the workdir is a tmpfs filled from the image: podman's tmpcopyup).

The container: `--read-only` root; size-limited tmpfs mounts for the workdir, /tmp, HOME, /tests,
/logs, /dev/shm and the harness's state; `--network none` unless the task allows internet;
`--memory`, `--memory-swap` (no swap), `--pids-limit`, `--cpus`; no capabilities, no new
privileges; uid 1000 (`agent`) with our /etc/passwd; libfaketime and libstdbuf from the host,
mounted read-only (they need a glibc at least as new as the host's: Debian 12 and newer).
Each container is labelled with its harness process (PID and start time); a process's first
container removes those whose harness is gone (a crash leaves them: conmon keeps them alive).

Podman runs with a containers.conf that obsspec owns (CONTAINERS_CONF, never the user's global
one): runtime runc, cgroupfs, file events and ulimits no higher than our own hard limits (with
Podman's defaults, every start failed here: `setrlimit RLIMIT_NOFILE: Operation not permitted`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from obsspec.env import seccomp
from obsspec.env.bwrap import HARNESS_TMPFS_MB, SHM_MB, STATE_DIR

BASE_IMAGE = "obsspec-debian:bookworm"
TASK_REPO = "obsspec-task"
# On top of minbase: the janitor's python3, and the tools the built-in task families' reference
# solutions use beyond coreutils (the bubblewrap sandbox has the host's /usr instead).
BASE_PACKAGES = ("python3", "jq", "bzip2", "xz-utils", "zip", "unzip", "sqlite3")
PACKAGES_LABEL = "obsspec.packages"  # the base image's BASE_PACKAGES: other ones, it is rebuilt
LABEL = "obsspec.episode"
OWNER_LABEL = "obsspec.owner"  # 'PID:START' of the harness process that started the container
# A build context is text (Task.image_files): this entry of it lists, one a line, the files that
# are executable in the task folder; it is not written into the context, the files it names get
# mode 0755 there (so `COPY run.sh /app/` keeps run.sh runnable).
EXECUTABLES = ".obsspec-executable"
SUPERVISOR = "/usr/lib/obsspec/bash"  # execute-only copy of the image's bash (see above)
LIBS = "/run/obsspec-libs"            # where the host's libfaketime and libstdbuf are mounted
# runc could not set a process limit of 96,362 (this machine's hard limit; "operation not
# permitted") but could set 32,768; the container's pids cgroup is the real limit anyway.
NPROC_CAP = 32768
BUILD_TIMEOUT_S = 1800.0
BASE_BUILD_TIMEOUT_S = 900.0
INSTALL_HINT = "run `sudo apt-get install podman runc mmdebstrap` (or `make install-podman`)"
# FROM names that mean our base (Debian 12): with or without a registry prefix.
LOCAL_BASE = re.compile(r"(docker\.io/)?(library/)?debian:(bookworm|bookworm-slim|12(\.\d+)*(-slim)?)")

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class PodmanMissing(RuntimeError):
    """podman (or runc) is not installed here."""


class ImageUnavailable(ValueError):
    """A task's image cannot be had here (an unknown base, a failed build): one line, the task's
    problem, not the machine's."""


@dataclass(frozen=True)
class Environment:
    """What a task asks of its container. `files` is the build context (with its Dockerfile);
    `image` an image name used as it is (task.toml's docker_image) when there is no Dockerfile."""

    files: dict[str, str] = field(default_factory=dict)
    image: str = ""
    cpus: float = 0.0
    memory_mb: int = 0
    storage_mb: int = 0
    internet: bool = False


# ---------------------------------------------------------------------------------------------
# Podman itself


def cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(root, "obsspec", "podman")
    os.makedirs(path, exist_ok=True)
    return path


def containers_conf() -> str:
    """Path of obsspec's own containers.conf (written when missing or different)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    limits = [f"nofile={_limit(nofile, 1 << 20)}", f"nproc={_limit(nproc, NPROC_CAP)}"]
    text = ("# written by obsspec (obsspec/env/podman.py); Podman reads it through CONTAINERS_CONF\n"
            "[containers]\n"
            f"default_ulimits = [{', '.join(f'{chr(34)}{v}{chr(34)}' for v in limits)}]\n"
            "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n")
    path = os.path.join(cache_dir(), "containers.conf")
    if not os.path.exists(path) or open(path).read() != text:
        _write(path, text)
    return path


def _limit(hard: int, cap: int) -> str:
    value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    return f"{value}:{value}"


def nproc_limit() -> int:
    """The process rlimit every container starts with (what containers.conf sets)."""
    return int(_limit(resource.getrlimit(resource.RLIMIT_NPROC)[1], NPROC_CAP).split(":")[0])


def check_podman() -> str:
    """Path of podman, or PodmanMissing saying how to install it."""
    path = shutil.which("podman")
    if path is None or shutil.which("runc") is None:
        missing = "podman" if path is None else "runc (podman's runtime here)"
        raise PodmanMissing(f"{missing} is not installed: {INSTALL_HINT}")
    return path


def env() -> dict[str, str]:
    """The environment every podman command of ours runs with."""
    return {**os.environ, "CONTAINERS_CONF": containers_conf()}


def podman(*args: str, timeout: float = 120.0, log=None) -> subprocess.CompletedProcess:
    """Run `podman ARGS`; output captured (or written to the file `log`)."""
    out = log if log is not None else subprocess.PIPE
    return subprocess.run([check_podman(), *args], env=env(), stdout=out, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, timeout=timeout, text=log is None)


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, timeout=60).returncode == 0


def leftover_containers() -> list[str]:
    """Names of episode containers that exist now (a crashed harness can leave some)."""
    out = podman("ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}", timeout=60)
    return out.stdout.split() if out.returncode == 0 else []


# ---------------------------------------------------------------------------------------------
# Containers a crashed harness left: every container is labelled with its owner, the harness
# process, as PID and start time (a PID alone may be reused by another process after a crash).


def process_start(pid: int) -> str:
    """When a process started (field 22 of /proc/PID/stat, clock ticks after boot); '' when no
    such process exists."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # (after the command name, which may hold spaces)


def owner() -> str:
    """This process, as the owner label of the containers it starts: 'PID:START'."""
    return f"{os.getpid()}:{process_start(os.getpid())}"


def owner_dead(label: str) -> bool:
    """Is the process an owner label names gone? (False for a label that is no owner's.)"""
    pid, _, start = label.partition(":")
    return pid.isdigit() and start.isdigit() and process_start(int(pid)) != start


def remove_orphans() -> list[str]:
    """Remove the episode containers whose owner is dead; their names. Containers of live
    owners, and containers without an owner label, are left alone."""
    out = podman("ps", "-a", "--filter", f"label={LABEL}", "--format", "json", timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"podman ps failed: {out.stdout.strip()[-300:]}")
    orphans = [c["Names"][0] for c in json.loads(out.stdout or "[]")
               if owner_dead((c.get("Labels") or {}).get(OWNER_LABEL, ""))]
    if orphans:
        done = podman("rm", "-f", "-t", "0", "--ignore", *orphans, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"could not remove leftover containers {orphans}: {done.stdout.strip()[-300:]}")
        _say(f"removed {len(orphans)} episode container(s) left by a harness that is gone: {' '.join(orphans)}")
    return orphans


_swept = False


def sweep_once() -> None:
    """`remove_orphans()` at this process's first container (the backend's start)."""
    global _swept
    with _lock("sweep"):
        if not _swept:
            remove_orphans()
            _swept = True


# ---------------------------------------------------------------------------------------------
# Images


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
    """The base image, built when it is missing or holds other packages than BASE_PACKAGES
    (mmdebstrap + podman import, about a minute; task images follow it: see task_tag)."""
    say = say or _say
    packages = ",".join(BASE_PACKAGES)
    with _lock(BASE_IMAGE), _FileLock("base"):
        label = podman("image", "inspect", "--format", f'{{{{index .Labels "{PACKAGES_LABEL}"}}}}', BASE_IMAGE,
                       timeout=60)
        if label.returncode == 0 and label.stdout.strip() == packages:
            return BASE_IMAGE
        if shutil.which("mmdebstrap") is None:
            raise PodmanMissing(f"building the base image {BASE_IMAGE} needs mmdebstrap: {INSTALL_HINT}")
        why = "its packages changed" if label.returncode == 0 else "about a minute, once"
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
        return BASE_IMAGE


def resolve_base(name: str, stages: set[str]) -> str:
    """What a FROM name means here: an earlier stage, our base, or a local image; else refused."""
    if name in stages or name == "scratch":
        return name
    if LOCAL_BASE.fullmatch(name):
        return ensure_base()
    if image_exists(name):
        return name
    raise ImageUnavailable(f"base image {name} is not here and cannot be pulled (no registry); "
                           f"only debian:bookworm, debian:bookworm-slim and debian:12 (built "
                           f"locally as {BASE_IMAGE}) or images already in podman can be used")


def from_names(dockerfile: str) -> list[tuple[str, str]]:
    """(base, stage name or '') of every FROM line, in order."""
    found = []
    for line in dockerfile.replace("\\\n", " ").splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            args = [w for w in words[1:] if not w.startswith("--")]
            if args:
                stage = args[2] if len(args) >= 3 and args[1].upper() == "AS" else ""
                found.append((args[0], stage))
    return found


def offline_problem(dockerfile: str) -> str:
    """Why a Dockerfile cannot be built here without a registry, by name only ('' = it can,
    as far as its FROM lines tell)."""
    stages: set[str] = set()
    for base, stage in from_names(dockerfile):
        if "$" in base:
            return f"FROM {base} uses a build argument we cannot resolve offline"
        if base not in stages and base != "scratch" and not LOCAL_BASE.fullmatch(base):
            if shutil.which("podman") is None or not image_exists(base):
                return (f"base image {base} is not available offline (only debian:bookworm, "
                        f"debian:bookworm-slim and debian:12 are built locally)")
        if stage:
            stages.add(stage)
    return ""


def ensure_image(environment: Environment, workdir: str, etc: dict[str, str], say=None) -> str:
    """The image for a task's environment (built once per distinct context, workdir and /etc
    files of ours: passwd, group, hosts; baked in, so that no host path shows in mountinfo)."""
    say = say or _say
    files = dict(environment.files)
    if "Dockerfile" not in files:
        files = {"Dockerfile": f"FROM {environment.image or 'debian:bookworm'}\n"}
    tag = task_tag(files, workdir, etc, base_ids(files["Dockerfile"]))
    digest = tag.split(":")[1]
    with _lock(tag), _FileLock(f"task-{digest}"):
        if image_exists(tag):
            return tag
        dockerfile = _with_our_layer(_resolved(files["Dockerfile"]), workdir, etc)
        say(f"building image {tag} for {workdir} ({len(files)} context files)")
        t0 = time.monotonic()
        log_path = os.path.join(cache_dir(), f"build-{digest}.log")
        with tempfile.TemporaryDirectory(prefix="obsspec-ctx-") as ctx, open(log_path, "w") as log:
            executable = set(files.get(EXECUTABLES, "").splitlines())
            for rel, text in files.items():
                if rel == EXECUTABLES:
                    continue
                path = os.path.join(ctx, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                    f.write(dockerfile if rel == "Dockerfile" else text)
                os.chmod(path, 0o755 if rel in executable else 0o644)
            for name, text in etc.items():
                with open(os.path.join(ctx, f".obsspec-etc-{name}"), "w") as f:
                    f.write(text)
            done = podman("build", "--pull=never", "--layers", "-t", tag, "-f",
                          os.path.join(ctx, "Dockerfile"), ctx, timeout=BUILD_TIMEOUT_S, log=log)
        if done.returncode != 0:
            raise ImageUnavailable(f"image build failed: {_reason(log_path)} (log: {log_path})")
        say(f"built {tag} in {time.monotonic() - t0:.0f} s")
        return tag


def task_tag(files: dict[str, str], workdir: str, etc: dict[str, str], bases: list[str]) -> str:
    """The task image's name: a hash of everything it is built from, the IDs of the images it
    builds on included (`bases`), so that a rebuilt base means rebuilt task images."""
    key = repr((sorted(files.items()), workdir, sorted(etc.items()), bases))
    return f"{TASK_REPO}:{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def base_ids(dockerfile: str) -> list[str]:
    """IDs of the images a Dockerfile's FROM lines resolve to (earlier stages and scratch have
    none), building our base first if it is missing."""
    stages: set[str] = set()
    ids = []
    for base, stage in from_names(dockerfile):
        resolved = resolve_base(base, stages)
        if resolved not in stages and resolved != "scratch":
            ids.append(image_id(resolved))
        if stage:
            stages.add(stage)
    return ids


def image_id(name: str) -> str:
    """The ID of a local image (`podman image inspect --format {{.Id}}`)."""
    out = podman("image", "inspect", "--format", "{{.Id}}", name, timeout=60)
    if out.returncode != 0 or not out.stdout.strip():
        raise ImageUnavailable(f"cannot read the ID of image {name}: {out.stdout.strip()[-200:]}")
    return out.stdout.strip()


def _resolved(dockerfile: str) -> str:
    """The Dockerfile with every FROM name that means our base replaced by it."""
    stages: set[str] = set()
    out = []
    for line in dockerfile.splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            args = [w for w in words[1:] if not w.startswith("--")]
            if args:
                base = resolve_base(args[0], stages)
                if len(args) >= 3 and args[1].upper() == "AS":
                    stages.add(args[2])
                line = line.replace(args[0], base, 1)
        out.append(line)
    return "\n".join(out) + "\n"


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


def _reason(log_path: str) -> str:
    with open(log_path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    ours = [line for line in lines if line.startswith("obsspec:")]
    errors = [line for line in lines if line.lower().startswith(("error", "e:"))]
    return (ours or errors or lines or ["(no output)"])[-1][:300]


def _last_line(log_path: str) -> str:
    return _reason(log_path)


def _say(message: str) -> None:
    print(f"obsspec: {message}", file=sys.stderr, flush=True)


def _write(path: str, text: str) -> None:
    tmp = f"{path}.{secrets.token_hex(4)}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# The container


def seccomp_profile() -> str:
    """Path of the seccomp profile (obsspec/env/seccomp.py's rules, the bubblewrap sandbox's)."""
    text = json.dumps(seccomp.oci_profile(), indent=1, sort_keys=True)
    path = os.path.join(cache_dir(), f"seccomp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json")
    if not os.path.exists(path):
        _write(path, text)
    return path


def argv(config, workdir: str, image: str, environment: Environment, name: str,
         supervisor_env: dict[str, str], cpu: int | None, script: str) -> list[str]:
    """`podman run` for one episode; the supervisor's environment goes in as --env flags."""
    memory_mb = environment.memory_mb or config.memory_mb
    workspace_mb = environment.storage_mb or config.workspace_mb

    def tmpfs(path: str, mb: int, mode: str = "0755") -> list[str]:
        # exec: scripts in the workspace and /tmp run, as in the bubblewrap sandbox
        return ["--tmpfs", f"{path}:rw,exec,nosuid,nodev,size={mb}m,mode={mode},U"]

    out = [check_podman(), "run", "-i", "--rm", "--name", name, "--label", f"{LABEL}=1",
           "--label", f"{OWNER_LABEL}={owner()}",
           "--pull=never", "--log-driver=none", "--entrypoint", SUPERVISOR,
           "--user", "1000:1000", "--passwd=false", "--hostname", config.hostname, "--no-hosts",
           "--read-only", "--read-only-tmpfs=false", "--cap-drop=all",
           "--security-opt=no-new-privileges", "--workdir", workdir,
           "--memory", f"{memory_mb}m", "--memory-swap", f"{memory_mb}m",
           "--pids-limit", str(config.max_procs),
           "--cpus", f"{environment.cpus or 1:g}",
           "--network", "slirp4netns" if environment.internet else "none",
           *tmpfs(workdir, workspace_mb), *tmpfs("/tmp", config.tmp_mb, "1777"),
           *tmpfs("/home/agent", config.home_mb), *tmpfs("/tests", config.home_mb),
           *tmpfs("/logs", HARNESS_TMPFS_MB), *tmpfs(STATE_DIR, HARNESS_TMPFS_MB, "0700"),
           *tmpfs("/dev/shm", SHM_MB, "1777")]
    if cpu is not None:
        out += ["--cpuset-cpus", str(cpu)]
    out += ["--security-opt", f"seccomp={seccomp_profile()}"]
    for key in ("OBSSPEC_FAKETIME_LIB", "OBSSPEC_STDBUF_LIB"):
        host = supervisor_env.get(key, "")
        if host:  # the host's library, at a path of ours inside (the image may hold its own)
            inside = f"{LIBS}/{os.path.basename(host)}"
            out += ["-v", f"{host}:{inside}:ro"]
            supervisor_env = {**supervisor_env, key: inside}
    for key, value in sorted(supervisor_env.items()):
        out += ["--env", f"{key}={value}"]
    return out + [image, "--noprofile", "--norc", "-c", script]


def host_pid(name: str) -> int:
    """Host PID of a running container's PID 1 (0 if it is not running)."""
    out = podman("inspect", "--format", "{{.State.Pid}}", name, timeout=60)
    try:
        return int(out.stdout.strip()) if out.returncode == 0 else 0
    except ValueError:
        return 0


def remove(name: str) -> None:
    """Kill and remove a container now (no grace period); quiet when it is already gone."""
    podman("rm", "-f", "-t", "0", "--ignore", name, timeout=120)


def container_name() -> str:
    return f"obsspec-{secrets.token_hex(6)}"

