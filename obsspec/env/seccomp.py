"""The sandbox's seccomp filter: the calls that change another process's limits or scheduling
work on the calling process only.

The agent runs under the same uid as the supervisor (PID 1), and the kernel lets a process set
the resource limits and the scheduling of any process of its uid; being non-dumpable, which
stops ptrace and /proc/1/mem, does not stop these. Each was an infrastructure failure the agent
could choose (its failures excluded from the advantage instead of scored):
- `prlimit --pid 1 --nofile=3` left PID 1 unable to open a pipe;
- `chrt -i -p 0 1` (SCHED_IDLE) with busy loops, or `renice -n 19 -p 1`, kept PID 1 off the CPU
  until the harness gave up on it.
The same calls on the caller itself (pid 0, what glibc's setrlimit, bash's `ulimit`, `nice` and
`taskset -c ... CMD` use) stay allowed; anything else gets EPERM.

A classic BPF program, as `bwrap --seccomp FD` reads it (what libseccomp's seccomp_export_bpf
writes), checked against the native syscall table and, on x86-64, the i386 (`int 0x80`) and x32
ones, so that no other calling convention gets around it.
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/filter.h, linux/seccomp.h, linux/audit.h
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARGS = 0, 4, 16  # offsets in struct seccomp_data (args: u64 each, low word first)
_X32_BIT = 0x40000000

# syscall -> the (argument, value) pairs that make it a call on the caller itself
RULES = {
    "prlimit64": ((0, 0),),            # (pid, ...)
    "sched_setparam": ((0, 0),),       # (pid, ...)
    "sched_setscheduler": ((0, 0),),
    "sched_setattr": ((0, 0),),
    "sched_setaffinity": ((0, 0),),
    "setpriority": ((0, 0), (1, 0)),   # (PRIO_PROCESS, who = 0, prio)
    "ioprio_set": ((0, 1), (1, 0)),    # (IOPRIO_WHO_PROCESS, who = 0, ioprio)
}
_NUMBERS = {  # the syscall tables (asm/unistd_64.h, unistd_32.h; asm-generic for aarch64)
    "x86_64": dict(prlimit64=302, sched_setparam=142, sched_setscheduler=144, sched_setattr=314,
                   sched_setaffinity=203, setpriority=141, ioprio_set=251),
    "i386": dict(prlimit64=340, sched_setparam=154, sched_setscheduler=156, sched_setattr=351,
                 sched_setaffinity=241, setpriority=97, ioprio_set=289),
    "aarch64": dict(prlimit64=261, sched_setparam=118, sched_setscheduler=119, sched_setattr=274,
                    sched_setaffinity=122, setpriority=140, ioprio_set=30),
}
# machine -> [(audit arch, table, with the x32 numbers too)]
_ARCHES = {
    "x86_64": [(0xC000003E, "x86_64", True), (0x40000003, "i386", False)],
    "aarch64": [(0xC00000B7, "aarch64", False)],
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def self_only_filter(machine: str | None = None) -> bytes:
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
    starts, denies = {}, []
    for name, conditions in RULES.items():
        starts[name] = len(prog)
        for arg, value in conditions:
            prog.append([_LD_W_ABS, 0, 0, _ARGS + 8 * arg])
            denies.append(len(prog))
            prog.append([_JEQ_K, 0, 0, value])
        prog.append([_RET_K, 0, 0, _RET_ALLOW])  # on the caller itself
    deny = len(prog)
    prog.append([_RET_K, 0, 0, _RET_ERRNO | errno.EPERM])
    for at, name in jumps:
        prog[at][1] = starts[name] - at - 1
    for at in denies:
        prog[at][2] = deny - at - 1
    if any(j > 255 for _, jt, jf, _ in prog for j in (jt, jf)):
        raise AssertionError("a seccomp jump does not fit in 8 bits")
    return b"".join(_insn(*i) for i in prog)
