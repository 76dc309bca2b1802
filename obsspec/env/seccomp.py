"""The sandbox's seccomp filter: one rule, `prlimit64` only on the calling process itself.

The agent runs under the same uid as the supervisor (PID 1), and the kernel lets a process set
the resource limits of any process of its uid: `prlimit --pid 1 --nofile=3` left PID 1 unable to
open a pipe, and the episode ended as an infrastructure failure the agent chose (its failures
excluded from the advantage instead of scored). Being non-dumpable, which stops ptrace and
/proc/1/mem, does not stop prlimit. glibc's own getrlimit/setrlimit (and bash's `ulimit`) call
`prlimit64` with pid 0, which stays allowed; any other pid gets EPERM.

A classic BPF program, as `bwrap --seccomp FD` reads it (what libseccomp's seccomp_export_bpf
writes): checked against the native syscall table and, on x86-64, the i386 (`int 0x80`) and x32
ones, so that no other calling convention gets around it.
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/filter.h, linux/seccomp.h, linux/audit.h
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (little-endian args)
_X32_BIT = 0x40000000

# machine -> [(audit arch, prlimit64 numbers in that table)]
_TABLES = {
    "x86_64": [(0xC000003E, (302, _X32_BIT | 302)), (0x40000003, (340,))],
    "aarch64": [(0xC00000B7, (261,))],
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def prlimit_filter(machine: str | None = None) -> bytes:
    """The compiled filter for this machine; empty where we do not know its syscall tables
    (the sandbox then runs without one, as before)."""
    tables = _TABLES.get(machine or platform.machine(), [])
    if not tables:
        return b""
    # Layout: per arch a block [arch check, one check per syscall number]; then the pid check,
    # then EPERM, then ALLOW. Jumps are relative to the next instruction.
    body: list[tuple[int, int, int, int]] = []
    pending: list[tuple[int, str]] = []  # (index, target) of jumps to fix up
    for arch, numbers in tables:
        body.append((_LD_W_ABS, 0, 0, _ARCH))
        skip = len(numbers) + 1  # past this block's loads and checks, to the next block
        body.append((_JEQ_K, 0, skip, arch))
        body.append((_LD_W_ABS, 0, 0, _NR))
        for nr in numbers:
            pending.append((len(body), "pid"))
            body.append((_JEQ_K, 0, 0, nr))
    body.append((_RET_K, 0, 0, _RET_ALLOW))  # no rule of ours: allowed
    pid_at = len(body)
    body.append((_LD_W_ABS, 0, 0, _ARG0_LOW))
    body.append((_JEQ_K, 1, 0, 0))  # pid 0: itself
    body.append((_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    body.append((_RET_K, 0, 0, _RET_ALLOW))
    for at, _ in pending:
        code, _, jf, k = body[at]
        body[at] = (code, pid_at - at - 1, jf, k)
    return b"".join(_insn(*i) for i in body)
