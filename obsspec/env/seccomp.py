"""The sandbox's seccomp filter: the few calls that let an agent reach past its own processes.

The agent runs under the same uid as the supervisor (PID 1), and the kernel lets a process set
the resource limits and the scheduling of any process of its uid; being non-dumpable, which
stops ptrace and /proc/1/mem, does not stop these. Each rule below was an infrastructure failure
the agent could choose (its failures excluded from the advantage instead of scored):
- `prlimit --pid 1 --nofile=3` left PID 1 unable to open a pipe;
- `chrt -i -p 0 1` (SCHED_IDLE) with busy loops, or `renice -n 19 -p 1`, kept PID 1 off the CPU
  until the harness gave up on it;
- an owner and O_ASYNC set on the output pipe every command shares with the harness sent SIGIO
  to the janitor after the agent was dead;
- System V shared memory outlives its processes, beyond every memory limit of the sandbox;
- the kernel's key store is per host uid, which every sandbox shares: one episode's key (an
  answer) was readable in another running beside it, and its quota filled;
- a pipe shrunk to one page (`F_SETPIPE_SZ`) lowers the bar for losing an end marker on the
  output pipe shared with the harness;
- POSIX message queues outlive the agent's processes and are charged per host uid
  (RLIMIT_MSGQUEUE): containers share one, so a sibling read a number from how many queues it
  could still open, and the host user could open none;
- io_uring is a large kernel surface no terminal task needs (Docker's default profile drops it too).
The limit and scheduling calls on the caller itself (pid 0, what glibc's setrlimit, bash's
`ulimit`, `nice` and `taskset -c ... CMD` use) stay allowed; denied calls get EPERM.

A classic BPF program, as `bwrap --seccomp FD` reads it (what libseccomp's seccomp_export_bpf
writes), checked against the native syscall table and, on x86-64, the i386 (`int 0x80`) and x32
ones, so that no other calling convention gets around it.
"""

from __future__ import annotations

import errno
import json
import platform
import struct

# linux/filter.h, linux/seccomp.h, linux/audit.h
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARGS = 0, 4, 16  # offsets in struct seccomp_data (args: u64 each, low word first)
_X32_BIT = 0x40000000

# syscall -> its rule:
#   ("self", ((arg, value), ...)): allowed only when every pair holds (a call on the caller)
#   ("not", arg, (value, ...)):    denied when that argument is one of the values
#   ("never",):                     always denied
RULES = {
    "prlimit64": ("self", ((0, 0),)),            # (pid, ...)
    "sched_setparam": ("self", ((0, 0),)),       # (pid, ...)
    "sched_setscheduler": ("self", ((0, 0),)),
    "sched_setattr": ("self", ((0, 0),)),
    "sched_setaffinity": ("self", ((0, 0),)),
    "setpriority": ("self", ((0, 0), (1, 0))),   # (PRIO_PROCESS, who = 0, prio)
    "ioprio_set": ("self", ((0, 1), (1, 0))),    # (IOPRIO_WHO_PROCESS, who = 0, ioprio)
    # Signal-driven I/O: an owner set on the output pipe the harness shares with every command
    # outlived the agent and killed the janitor with SIGIO (an infra error at will).
    # (and F_SETPIPE_SZ: a shared pipe shrunk to 4 KiB fills 16x sooner)
    "fcntl": ("not", 1, (8, 15, 10, 1031)),      # F_SETOWN, F_SETOWN_EX, F_SETSIG, F_SETPIPE_SZ
    "fcntl64": ("not", 1, (8, 15, 10, 1031)),
    "ioctl": ("not", 1, (0x8901, 0x8902)),       # FIOSETOWN, SIOCSPGRP
    # System V IPC objects outlive their processes: 3 GB of shared memory stayed held by a
    # sandbox whose limits said 2 GB and no process alive. (POSIX shm lives in /dev/shm, a
    # bounded tmpfs, and still works.)
    "shmget": ("never",), "semget": ("never",), "msgget": ("never",), "ipc": ("never",),
    # Keys are kept per host uid, and every sandbox runs as the same one: a concurrent episode
    # read another's key (a GRPO sibling could pass on its answer) and exhausted its quota.
    "add_key": ("never",), "request_key": ("never",), "keyctl": ("never",),
    "mq_open": ("never",),  # (without a queue the other mq_* calls have nothing to act on)
    "io_uring_setup": ("never",), "io_uring_enter": ("never",), "io_uring_register": ("never",),
}
_NUMBERS = {  # the syscall tables (asm/unistd_64.h, unistd_32.h; asm-generic for aarch64)
    "x86_64": dict(prlimit64=302, sched_setparam=142, sched_setscheduler=144, sched_setattr=314,
                   sched_setaffinity=203, setpriority=141, ioprio_set=251, fcntl=72, ioctl=16,
                   shmget=29, semget=64, msgget=68, add_key=248, request_key=249, keyctl=250,
                   mq_open=240, io_uring_setup=425, io_uring_enter=426, io_uring_register=427),
    "i386": dict(prlimit64=340, sched_setparam=154, sched_setscheduler=156, sched_setattr=351,
                 sched_setaffinity=241, setpriority=97, ioprio_set=289, fcntl=55, fcntl64=221,
                 ioctl=54, shmget=395, semget=393, msgget=399, ipc=117, add_key=286, request_key=287,
                 keyctl=288, mq_open=277, io_uring_setup=425, io_uring_enter=426, io_uring_register=427),
    "aarch64": dict(prlimit64=261, sched_setparam=118, sched_setscheduler=119, sched_setattr=274,
                    sched_setaffinity=122, setpriority=140, ioprio_set=30, fcntl=25, ioctl=29,
                    shmget=194, semget=190, msgget=186, add_key=217, request_key=218, keyctl=219,
                    mq_open=180, io_uring_setup=425, io_uring_enter=426, io_uring_register=427),
}
# machine -> [(audit arch, table, with the x32 numbers too)]
_ARCHES = {
    "x86_64": [(0xC000003E, "x86_64", True), (0x40000003, "i386", False)],
    "aarch64": [(0xC00000B7, "aarch64", False)],
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def sandbox_filter(machine: str | None = None) -> bytes:
    """The compiled filter for this machine; empty where we do not know its syscall tables
    (the sandbox then runs without one)."""
    arches = _ARCHES.get(machine or platform.machine(), [])
    if not arches:
        return b""
    prog: list[list[int]] = []  # [code, jt, jf, k]
    jumps: list[tuple[int, str]] = []  # (instruction, rule it jumps to on a match)
    for arch, table, x32 in arches:
        calls = [(nr, name) for name, nr in _NUMBERS[table].items()]
        calls += [(_X32_BIT | nr, name) for nr, name in calls] if x32 else []
        prog.append([_LD_W_ABS, 0, 0, _ARCH])
        prog.append([_JEQ_K, 0, len(calls) + 1, arch])  # another arch: on to the next block
        prog.append([_LD_W_ABS, 0, 0, _NR])
        for nr, name in calls:
            jumps.append((len(prog), name))
            prog.append([_JEQ_K, 0, 0, nr])
    prog.append([_RET_K, 0, 0, _RET_ALLOW])  # no rule of ours
    starts: dict[str, int] = {}
    to_deny: list[tuple[int, str]] = []  # (instruction, "jt" or "jf") that goes to EPERM
    for name, rule in RULES.items():
        starts[name] = len(prog)
        if rule[0] == "self":
            for arg, value in rule[1]:
                prog.append([_LD_W_ABS, 0, 0, _ARGS + 8 * arg])
                to_deny.append((len(prog), "jf"))
                prog.append([_JEQ_K, 0, 0, value])
            prog.append([_RET_K, 0, 0, _RET_ALLOW])
        elif rule[0] == "not":
            prog.append([_LD_W_ABS, 0, 0, _ARGS + 8 * rule[1]])
            for value in rule[2]:
                to_deny.append((len(prog), "jt"))
                prog.append([_JEQ_K, 0, 0, value])
            prog.append([_RET_K, 0, 0, _RET_ALLOW])
        else:
            prog.append([_RET_K, 0, 0, _RET_ERRNO | errno.EPERM])
    deny = len(prog)
    prog.append([_RET_K, 0, 0, _RET_ERRNO | errno.EPERM])
    for at, name in jumps:
        prog[at][1] = starts[name] - at - 1
    for at, branch in to_deny:
        prog[at][1 if branch == "jt" else 2] = deny - at - 1
    if any(j > 255 for _, jt, jf, _ in prog for j in (jt, jf)):
        raise AssertionError("a seccomp jump does not fit in 8 bits")
    return b"".join(_insn(*i) for i in prog)


# ---------------------------------------------------------------------------------------------
# Containers: the runtime's default profile with these rules added

RUNTIME_DEFAULTS = ("/etc/containers/seccomp.json", "/usr/share/containers/seccomp.json")
CLONE_NEWUSER = 0x10000000
# A container must not make user namespaces (bwrap's --disable-userns): uid 0 with every
# capability over new mount and network namespaces is where most local privilege escalations
# start. containers-common's default allows `unshare` and `clone` outright. clone3 passes its
# flags in memory a filter cannot read: ENOSYS makes glibc fall back to clone.
NO_USERNS = {"unshare": 0, "clone": 0}  # syscall -> index of its flags argument
ENOSYS = {"clone3"}


def runtime_default() -> dict | None:
    """The container runtime's default profile on this host (containers-common), or None."""
    for path in RUNTIME_DEFAULTS:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            continue
    return None


def oci_profile(default: dict | None = None) -> dict:
    """The OCI seccomp profile of every container (`podman run --security-opt seccomp=FILE`):
    the runtime's default (`default`, an allow-list), with every call these rules govern taken
    out of its allow-list and put back under the rules; no user namespaces; clone3 ENOSYS.
    Without a default, every call is allowed but these (the bubblewrap sandbox's profile).

    Arguments are compared as 64-bit values (the filter above reads their low words): a call
    on the caller itself with high bits set in its pid is denied too, which only makes a call no
    program makes fail. libseccomp lets an unconditional allow override any conditional deny of
    the same call and, for overlapping conditions, the first rule added wins: so nothing here is
    allowed unconditionally, and each deny comes before its allow."""
    governed = set(RULES) | set(NO_USERNS) | ENOSYS
    deny = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    ours = []
    for name, rule in RULES.items():
        if rule[0] == "self":  # denied when any pair fails, allowed when all hold
            ours += [{"names": [name], **deny, "args": [_arg(arg, value, "SCMP_CMP_NE")]} for arg, value in rule[1]]
            ours.append({"names": [name], "action": "SCMP_ACT_ALLOW",
                         "args": [_arg(arg, value, "SCMP_CMP_EQ") for arg, value in rule[1]]})
        elif rule[0] == "not":  # the command's low word, as the kernel reads it
            ours += [{"names": [name], **deny, "args": [_arg(rule[1], 0xFFFFFFFF, "SCMP_CMP_MASKED_EQ", value)]}
                     for value in rule[2]]
            ours.append({"names": [name], "action": "SCMP_ACT_ALLOW",  # (high word zero: a real command)
                         "args": [_arg(rule[1], 0xFFFFFFFF00000000, "SCMP_CMP_MASKED_EQ", 0)]})
        else:
            ours.append({"names": [name], **deny})
    for name, arg in NO_USERNS.items():
        ours.append({"names": [name], **deny, "args": [_arg(arg, CLONE_NEWUSER, "SCMP_CMP_MASKED_EQ", CLONE_NEWUSER)]})
        ours.append({"names": [name], "action": "SCMP_ACT_ALLOW", "args": [_arg(arg, CLONE_NEWUSER, "SCMP_CMP_MASKED_EQ", 0)]})
    ours.append({"names": sorted(ENOSYS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    if default is None:
        return {"defaultAction": "SCMP_ACT_ALLOW",
                "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64"],
                "syscalls": [r for r in ours if r["action"] != "SCMP_ACT_ALLOW"]}
    kept = []
    for entry in default.get("syscalls", []):
        names = [n for n in entry.get("names", []) if n not in governed]
        if names:
            kept.append({**entry, "names": names})
    return {**default, "syscalls": ours + kept}


def _arg(index: int, value: int, op: str, value_two: int = 0) -> dict:
    return {"index": index, "value": value, "valueTwo": value_two, "op": op}
