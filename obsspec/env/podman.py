"""How an episode's Podman container is run: its command line, mounts, environment and cleanup.

A task whose environment is a container image (a Harbor `environment/Dockerfile`, or
`[environment] docker_image`) runs in a Podman container with the same episode contract as the
bubblewrap sandbox: PID 1 is obsspec's supervisor (scripts/supervisor.sh), fed on stdin, and the
harness (obsspec/env/sandbox.py) speaks the same protocol to it. Only the command line differs.
Its image (our Debian 12 base, or the task's own) comes from obsspec/env/images.py.

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
import resource
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from obsspec.env import seccomp, semantics
from obsspec.env.bwrap import HARNESS_TMPFS_MB, SHM_MB, STATE_DIR, script

LABEL = "obsspec.episode"
OWNER_LABEL = "obsspec.owner"  # 'PID:START' of the harness process that started the container
SUPERVISOR = "/usr/lib/obsspec/bash"  # execute-only copy of the image's bash (images.py)
LIBS = "/run/obsspec-libs"            # where the host's libfaketime and libstdbuf are mounted
# runc could not set a process limit of 96,362 (this machine's hard limit; "operation not
# permitted") but could set 32,768; the container's pids cgroup is the real limit anyway.
NPROC_CAP = 32768
HARNESS_MEMORY_MB = 256  # memory the agent's tmpfs mounts leave to the harness and the verifier
INSTALL_HINT = "run `sudo apt-get install podman runc mmdebstrap` (or `make install-podman`)"


class PodmanMissing(RuntimeError):
    """podman (or runc) is not installed here."""


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
    semantics: str = ""  # obsspec/env/semantics.py ('' = isolated)
    etc_named: tuple[str, ...] = ()  # /etc settings the task's tests name (semantics.etc_named)
    tests: str = field(default="", repr=False)  # the task's tests (semantics.needs_services)


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


def say(message: str) -> None:
    print(f"obsspec: {message}", file=sys.stderr, flush=True)


def _write(path: str, text: str) -> None:
    tmp = f"{path}.{secrets.token_hex(4)}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


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
    # (one 'NAME<tab>OWNER' line per container; a line of anything else, a warning of podman's
    # on the same stream, names no dead owner)
    fmt = f'{{{{.Names}}}}\t{{{{index .Labels "{OWNER_LABEL}"}}}}'
    out = podman("ps", "-a", "--filter", f"label={LABEL}", "--format", fmt, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"podman ps failed: {out.stdout.strip()[-300:]}")
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    orphans = [row[0] for row in rows if len(row) == 2 and owner_dead(row[1])]
    if orphans:
        done = podman("rm", "-f", "-t", "0", "--ignore", *orphans, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"could not remove leftover containers {orphans}: {done.stdout.strip()[-300:]}")
        say(f"removed {len(orphans)} episode container(s) left by a harness that is gone: {' '.join(orphans)}")
    return orphans


_swept = False
_sweep_lock = threading.Lock()


def sweep_once() -> None:
    """`remove_orphans()` at this process's first container (the backend's start)."""
    global _swept
    with _sweep_lock:
        if not _swept:
            remove_orphans()
            _swept = True


# ---------------------------------------------------------------------------------------------
# The container


def seccomp_profile() -> str:
    """Path of the seccomp profile: the runtime's default with obsspec/env/seccomp.py's rules
    (the bubblewrap sandbox's), no user namespaces (seccomp.oci_profile)."""
    text = json.dumps(seccomp.oci_profile(seccomp.runtime_default()), indent=1, sort_keys=True)
    path = os.path.join(cache_dir(), f"seccomp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json")
    if not os.path.exists(path):
        _write(path, text)
    return path


def argv(config, workdir: str, image: str, environment: Environment, name: str,
         supervisor_env: dict[str, str], cpu: int | None, script: str) -> list[str]:
    """`podman run` for one episode; the supervisor's environment goes in as --env flags."""
    memory_mb = environment.memory_mb or config.memory_mb
    sizes = fit_tmpfs({workdir: environment.storage_mb or config.workspace_mb, "/tmp": config.tmp_mb,
                       "/home/agent": config.home_mb, "/tests": config.home_mb, "/logs": HARNESS_TMPFS_MB,
                       STATE_DIR: HARNESS_TMPFS_MB, "/dev/shm": SHM_MB}, memory_mb)

    def tmpfs(path: str, mode: str = "0755") -> list[str]:
        # exec: scripts in the workspace and /tmp run, as in the bubblewrap sandbox
        return ["--tmpfs", f"{path}:rw,exec,nosuid,nodev,size={sizes[path]}m,mode={mode},U"]

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
           *tmpfs(workdir), *tmpfs("/tmp", "1777"), *tmpfs("/home/agent"), *tmpfs("/tests"),
           *tmpfs("/logs"), *tmpfs(STATE_DIR, "0700"), *tmpfs("/dev/shm", "1777")]
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


def fit_tmpfs(sizes: dict[str, int], memory_mb: int) -> dict[str, int]:
    """The tmpfs sizes (path -> MiB), scaled down together where their sum would leave the
    container less than HARNESS_MEMORY_MB (a quarter of it, for small containers): their pages
    are charged to its memory cgroup, nothing frees them before verification, and a janitor or
    verifier that finds no memory left would be an infra error at the agent's choice."""
    room = memory_mb - min(HARNESS_MEMORY_MB, memory_mb // 4) - len(sizes)  # (each rounds up to 1 at least)
    scale = min(1.0, room / max(1, sum(sizes.values())))
    return {path: max(1, int(mb * scale)) for path, mb in sizes.items()}


# Harbor semantics: the agent's capabilities are Docker's default set and NET_ADMIN (its own
# network namespace); the harness (PID 1) holds SYS_ADMIN on top to make the agent's and the
# verifier's namespaces (scripts/world.py keeps the same list for the agent).
AGENT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
              "NET_BIND_SERVICE", "NET_ADMIN", "NET_RAW", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP")
HARBOR_DIR = "/run/obsspec"  # the harness's mounts: upper (the agent's changes), verify
HARNESS_PROCS = 64  # processes the harness may start beyond the agent's max_procs


def harbor_argv(config, workdir: str, image: str, environment: Environment, name: str,
                supervisor_env: dict[str, str], script: str, uid_base: int | None) -> list[str]:
    """`podman run` for an episode with Harbor semantics (scripts/supervisor_harbor.sh): the
    image's root read-only (the harness's pristine tools; the agent writes to an overlay on a
    tmpfs of the task's storage size), root in a user namespace of its own host range
    (`uid_base`; a non-root harness gets podman's rootless one), no no-new-privileges (setuid
    programs of the image work, as in Docker)."""
    memory_mb = environment.memory_mb or config.memory_mb
    # The agent's writes are a tmpfs charged to the container's memory: filled, it must leave the
    # harness (PID 1, the relay, the janitor, the verifier) room to work, so it is capped there.
    storage_mb = harbor_tmpfs(config, environment)["upper"]

    def tmpfs(path: str, mb: int, mode: str = "0755") -> list[str]:
        return ["--tmpfs", f"{path}:rw,exec,suid,nodev,size={mb}m,mode={mode}"]

    out = [check_podman(), "run", "-i", "--rm", "--name", name, "--label", f"{LABEL}=1",
           "--label", f"{OWNER_LABEL}={owner()}", "--pull=never", "--log-driver=none",
           "--entrypoint", SUPERVISOR, "--user", "0:0", "--passwd=false", "--hostname", config.hostname,
           "--no-hosts", "--read-only", "--read-only-tmpfs=false", "--cap-drop=all",
           *(f"--cap-add={cap}" for cap in (*AGENT_CAPS, "SYS_ADMIN")), "--workdir", "/",
           "--memory", f"{memory_mb}m", "--memory-swap", f"{memory_mb}m",
           "--pids-limit", str(config.max_procs + HARNESS_PROCS), "--cpus", f"{environment.cpus or 1:g}",
           "--network", "slirp4netns" if environment.internet else "none",
           *tmpfs(STATE_DIR, HARNESS_TMPFS_MB, "0700"), *tmpfs(HARBOR_DIR, 1, "0700"),
           *tmpfs(f"{HARBOR_DIR}/upper", storage_mb),
           *tmpfs(f"{HARBOR_DIR}/verify", config.tmp_mb, "0700"),
           "--security-opt", f"seccomp={seccomp_profile()}"]
    if uid_base is not None:
        out += ["--uidmap", f"0:{uid_base}:65536", "--gidmap", f"0:{uid_base}:65536"]
    for key, value in sorted(supervisor_env.items()):
        out += ["--env", f"{key}={value}"]
    return out + [image, "--noprofile", "--norc", "-c", script]


def harbor_tmpfs(config, environment: Environment) -> dict[str, int]:
    """MiB of the agent's tmpfs mounts under Harbor semantics: its writes (`upper`, the task's
    storage) and its /dev/shm, fitted in the container's memory together."""
    memory_mb = environment.memory_mb or config.memory_mb
    return fit_tmpfs({"upper": environment.storage_mb or config.workspace_mb, "shm": SHM_MB}, memory_mb)


def harbor_env(config, workdir: str, image: dict, environment: Environment) -> dict[str, str]:
    """PID 1's environment for Harbor semantics (what podman adds to the image's own `ENV`): the
    scripts it runs, the limits, the /etc settings the verifier takes from the image, and what
    `docker run` would do with the image (`image`: images.image_config)."""
    pristine = [e for e in semantics.ETC_PRISTINE if e not in environment.etc_named]
    services = (config.harbor_services == "live" or config.harbor_services == "auto"
                and semantics.needs_services(environment.tests, image["entrypoint"] + image["cmd"]))
    env = {"OBSSPEC_WORKDIR": workdir, "OBSSPEC_STATE_DIR": STATE_DIR,
           "OBSSPEC_ETC_PRISTINE": ",".join(pristine), "OBSSPEC_SERVICES": "1" if services else "0", "OBSSPEC_SHM_MB": str(harbor_tmpfs(config, environment)["shm"]),
           "OBSSPEC_MAX_PROCS": str(config.max_procs), "OBSSPEC_HARNESS_PROCS": str(config.max_procs + HARNESS_PROCS),
           "OBSSPEC_USER": image["user"], "OBSSPEC_IMAGE_WORKDIR": image["workdir"],
           "OBSSPEC_ENTRYPOINT": shlex.join(image["entrypoint"] + image["cmd"]),
           "OBSSPEC_INTERNET": "1" if environment.internet else "0",
           # (the runner's: no pinned clock, no preloaded library)
           "OBSSPEC_DETERMINISTIC": "0", "OBSSPEC_FAKETIME_LIB": "", "OBSSPEC_STDBUF_LIB": ""}
    env.update({f"OBSSPEC_{name.upper()}": script(f"{name}.{ext}") for name, ext in
                (("runner", "sh"), ("janitor", "py"), ("relay", "py"), ("world", "py"))})
    return env


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

