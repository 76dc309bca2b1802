"""Episode semantics: how a task's terminal behaves, as a property of the task.

    semantics.describe("harbor")     # the lines `obsspec shell` prints and the manifest records

Two profiles:
- `isolated` (the built-in families, and the default of a Task): the deterministic sandbox of
  docs/ENVIRONMENT.md. Background work ends with its command, the agent is uid 1000 on a
  read-only system, the clock is logical and frozen within a turn, file times are re-stamped to
  it, and the verifier gets an empty HOME of its own.
- `harbor` (imported Harbor tasks, by default): the terminal their authors ran them in, a
  container where the agent is the image's USER (root unless the Dockerfile says otherwise).
  It runs in a Podman container whatever the recipe's backend (obsspec/env/podman.py).

What `harbor` gives up against `isolated`, and what it keeps, is `GIVES_UP` and `KEEPS`
(docs/ENVIRONMENT.md, "Harbor semantics", and docs/REWARD_HACKS.md say how each is done).
"""

from __future__ import annotations

import re

ISOLATED = "isolated"
HARBOR = "harbor"
NAMES = (ISOLATED, HARBOR)

BEHAVES = {
    ISOLATED: (
        "background processes end with the command that started them",
        "the agent is uid 1000 ('agent'); the system is read-only outside the workspace, /tmp and HOME",
        "the clock is logical (clock_start + turn x turn_seconds), frozen within a command",
        "file times are re-stamped to the logical clock after each command",
        "the verifier gets an empty HOME of its own; no agent process is alive when it runs",
    ),
    HARBOR: (
        "background processes (services) live on across commands, and while the verifier runs "
        "when its tests talk to a service (else they are stopped from the verifier's start)",
        "the image's ENTRYPOINT/CMD starts with the episode, as `docker run IMAGE` would start it",
        "the agent is the image's USER: root in the container's user namespace (no host privileges) "
        "unless the Dockerfile names another user; the image's filesystem is writable",
        "agent and verifier share the real clock (sleeps, waits and timeouts work) and, the verifier "
        "running as root as in Harbor, root's HOME (one HOME unless the image names another USER)",
        "file times are left as the kernel sets them",
    ),
}

GIVES_UP = (
    "where the verifier may need the agent's services (needs_services, sandbox.harbor_services), "
    "its processes run beside the verifier: they answer its queries, and could change a file "
    "between the janitor's sweep and the verifier's read",
    "observations that show times or dates differ between episodes (no logical clock)",
    "what the agent installs under /usr, /bin, /lib* (apt, pip) is not the verifier's: the "
    "verifier runs with the image's own system directories",
)

KEEPS = (
    "the verifier's files (/tests), its reward file (/logs) and its interpreter (the image's "
    "/usr, /bin, /lib*, loader settings) are out of every agent process's reach",
    "the harness (PID 1, its output pipe, its janitor) runs where no agent process can see, "
    "signal or trace it; the agent has no host privileges",
    "a task whose service is down because the agent never started it scores 0, not an "
    "infrastructure error",
)


# /etc entries whose content makes a program load, run or fetch code. Under Harbor semantics the
# verifier takes them from the image, whatever the agent wrote there (scripts/world.py), unless
# the task's tests name the entry (then it is the task's subject: etc_named). '*' ends a prefix.
ETC_PRISTINE = (
    "ld.so.preload", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",  # the dynamic loader
    "alternatives",                                                 # what /usr/bin/awk & co. are
    "nsswitch.conf",            # glibc's NSS: a service name is a library path (relative ones too)
    "python3*", "perl", "php*", "java*",  # interpreters' startup and module paths, providers
    "ssl", "pki",               # OpenSSL's configuration (provider and engine libraries), CA stores
    "gitconfig",                # core.fsmonitor, hooks, filters: programs git runs
    "apt", "dpkg",              # hooks apt and dpkg run (a verifier that installs its runner)
    "ssh",                      # ProxyCommand, LocalCommand
    "sudo.conf", "sudoers", "sudoers.d", "pam.d", "pam.conf", "security", "environment",  # su, sudo
    "profile", "profile.d", "bash.bashrc", "inputrc",  # login and interactive shells
    "pip.conf", "uv", "xdg", "npmrc", "gemrc",          # where packages come from
)


def etc_named(tests: str) -> tuple[str, ...]:
    """The ETC_PRISTINE entries a task's tests name as /etc/NAME: the task asks the agent for
    them, so its verifier reads the agent's."""
    found = []
    for entry in ETC_PRISTINE:
        stem = re.escape(entry.rstrip("*"))
        if re.search(rf"/etc/{stem}" + ("" if entry.endswith("*") else r"(?![\w.-])"), tests):
            found.append(entry)
    return tuple(found)


# What in a task's tests says its verifier talks to something the agent runs (a server, a daemon,
# a process it checks for): then, under Harbor semantics, the agent's processes run beside it.
SERVICE_WORDS = re.compile(
    r"\b(curl|wget|nc|ncat|netcat|socat|telnet|ssh|localhost|127\.0\.0\.1|0\.0\.0\.0|https?://|socket|"
    r"requests|urllib|http\.client|aiohttp|httpx|ps|pgrep|pidof|pkill|ss|netstat|lsof|fuser|systemctl|"
    r"service|supervisorctl|redis-cli|psql|mysql|mongo|mongosh|sqlcmd|rabbitmqctl|kafka|grpc|port|"
    # a verifier that waits or looks for something to happen expects something alive to do it
    r"sleep|wait|kill|pid|daemon|cron|watch|tail)\b")
SHELLS = {"bash", "sh", "/bin/bash", "/bin/sh", "/usr/bin/bash", "/usr/bin/sh", "zsh", "/bin/zsh"}


def needs_services(tests: str, entrypoint: list[str]) -> bool:
    """May the verifier need the agent's processes alive? When its tests name a network client,
    an address or a process probe, or the image starts a service of its own (an ENTRYPOINT or
    CMD other than a bare shell). Else they stay stopped while it runs (supervisor_harbor.sh)."""
    serves = bool(entrypoint) and not (len(entrypoint) == 1 and entrypoint[0] in SHELLS)
    return serves or bool(SERVICE_WORDS.search(tests))


def check(name: str) -> str:
    if name not in NAMES:
        raise ValueError(f"semantics must be one of {', '.join(NAMES)}, not {name!r}")
    return name


def describe(name: str) -> list[str]:
    """One line per behaviour of the profile (what `obsspec shell` prints)."""
    return list(BEHAVES[check(name or ISOLATED)])
