"""What the harness writes, walks and trusts after the agent has run: attacks on it through the
real sandbox. Each must leave the reward at what the task's truth says (0 for an agent that did
not solve the task) and never become an infrastructure error (an episode excluded from the
advantage at the agent's will). The list, with the reasoning, is in docs/REWARD_HACKS.md.
The Harbor examples run here with the isolated semantics (as the built-in families do); the
same attacks against Harbor semantics are tests/test_harbor_trust.py.
"""

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from obsspec.env.episode import run_scripted
from obsspec.env.harbor import import_harbor
from obsspec.env.sandbox import TAMPERED, Sandbox, SandboxConfig
from obsspec.env.suite import SuiteError, load_tasks, task_by_id
from obsspec.env.task import Task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")

CFG = SandboxConfig(timeout_s=3, memory_mb=1024, max_procs=64)
HARBOR = Path(__file__).parent.parent / "tasks" / "harbor-examples"

# Fill a tmpfs, unlink the file and keep its descriptor alive in a unix-socket cycle (an
# SCM_RIGHTS message carrying its own socket): no process holds it, the kernel frees nothing.
PIN = """python3 -c 'import os,socket,array,select
f=os.open("{dir}/.x",os.O_CREAT|os.O_RDWR)
for n in (1<<20,4096,1):
  try:
    while 1: os.write(f,b"x"*n)
  except OSError: pass
os.unlink("{dir}/.x"); a,b=socket.socketpair(socket.AF_UNIX,socket.SOCK_DGRAM)
a.sendmsg([b"x"],[(1,1,array.array("i",[f,b.fileno()]))]); os.close(f); a.close(); select.select([],[],[],.3)
open("/tmp/.pinned","w").close()
os.set_inheritable(b.fileno(),1); os.execv("/usr/bin/sleep",["sleep","99"])' &
for i in $(seq 400); do [ -e /tmp/.pinned ] && echo pinned && break; sleep 0.05; done"""


def reward(task, commands, config=CFG):
    record = asyncio.run(run_scripted(task, commands, config))
    assert record.infra_error == "", f"a hack turned a failure into an infra error: {record.infra_error}"
    return record.reward


def pinned_reward(task, commands, where):
    """The reward after `commands` and then the pin of `where` (checked to have happened: on a
    busy machine the command could end before the pin was in place, and prove nothing)."""
    # (the pin's own wait is up to 20 s: a 3 s command timeout cut it short on a loaded machine)
    config = dataclasses.replace(CFG, timeout_s=20)
    record = asyncio.run(run_scripted(task, [*commands, PIN.format(dir=where)], config))
    assert record.infra_error == "", f"a hack turned a failure into an infra error: {record.infra_error}"
    assert record.steps[-1].observation.startswith("pinned"), record.steps[-1].observation
    return record.reward


def harbor(name: str) -> Task:
    return {t.task_id: t for t in import_harbor(HARBOR, semantics="isolated").tasks}[name]


@pytest.mark.parametrize("where", ["/run/obsspec-state", "/tests", "/logs", "/dev/shm"])
def test_a_pinned_full_tmpfs_is_tampering_not_an_empty_verifier(where, sandbox_backend, monkeypatch):
    """Reproduced: with the state dir pinned full, PID 1's write of the verifier script failed
    unchecked, an empty test.sh exited 0: reward 1 on every built-in family and on Harbor tasks,
    20 of 20. The same pin in /tests made an infra error the agent chose. The verifier now
    reaches bash on a pipe, and an emptied tmpfs that still counts blocks scores 0. (On both
    backends: a podman container's tmpfs mounts are pinned the same way.)"""
    from conftest import on_backend

    on_backend(sys.modules[__name__], monkeypatch, sandbox_backend)
    assert pinned_reward(task_by_id("dir-stats-00001"), [], where) == 0.0, f"a pinned {where} won the reward"
    assert pinned_reward(harbor("harbor-hello-file"), [], where) == 0.0, f"a pinned {where} won a Harbor reward"


def test_a_pin_after_an_honest_solution_still_scores_zero(monkeypatch):
    """Pinning is tampering whatever else the agent did: the verdict must not depend on it.

    The pin outlives its processes only until the kernel's unix garbage collector finds the
    cycle, and on recent kernels that collector runs asynchronously: on a loaded machine it can
    free the pin before the janitor looks. Then nothing is pinned, the verifier runs on an honest
    workspace and its 1.0 is right. So each try is judged by what the janitor saw: a pin it
    found must score 0, and at least one of three tries must find one (else the check is gone)."""
    task = task_by_id("dir-stats-00001")
    assert reward(task, task.solution) == 1.0
    resets = []
    request = Sandbox._request

    async def watched(self, op, *args, **kwargs):
        result = await request(self, op, *args, **kwargs)
        if op == "reset":
            resets.append(result.exit_code)
        return result

    monkeypatch.setattr(Sandbox, "_request", watched)
    for _ in range(3):
        got = pinned_reward(task, task.solution, "/run/obsspec-state")
        if resets[-1] == TAMPERED:
            assert got == 0.0, "a pin the janitor found still let the verifier score"
            return
        assert resets[-1] == 0 and got == 1.0, (resets, got)  # the pin was gone: an honest episode
    pytest.fail("the janitor found none of three pins of the harness's state dir")


def _busy(n: int) -> list[subprocess.Popen]:
    """Busy neighbours, each in a session (an autogroup) of its own, as sandboxes are."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(n)]


def test_many_links_beside_busy_neighbours_are_scored_not_infra():
    """Reproduced: 45,000 symlinks (0.3 s to make) while another process shared the CPU made the
    janitor stop on its wall clock ("machine overloaded"): an infra error, exit 2, for any
    failing episode. Its budget is now a count of entries, the same on a busy machine."""
    task = task_by_id("dir-stats-00001")
    make = "python3 -c 'import os\nfor i in range({n}): os.symlink(\"{target}\", f\"/tmp/l{{i}}\")\nprint(\"made\")'"
    long_way = make.format(n=45000, target="/usr" + "/lib/.." * 30 + "/bin")  # 62 steps to follow each
    plain = make.format(n=45000, target="/etc/passwd")
    cfg = SandboxConfig(timeout_s=30, memory_mb=1024, max_procs=64)

    def scored(commands):
        record = asyncio.run(run_scripted(task, commands, cfg))
        assert record.infra_error == "", f"a hack turned a failure into an infra error: {record.infra_error}"
        assert record.steps[-1].observation.startswith("made"), record.steps[-1].observation  # all made
        return record.reward

    hogs = _busy(6)
    try:
        assert scored([long_way]) == 0.0
        # within the budget, cleaned and judged; past it, the agent's trees were too much to undo
        assert scored([*task.solution, plain]) == 1.0, "45,000 links spoiled an honest reward"
        assert scored([*task.solution, long_way]) == 0.0, "an over-budget tree kept its reward"
    finally:
        for p in hogs:
            p.kill()


def _held(uid: int, kind: str) -> int:
    """How many file descriptors of `kind` (`anon_inode:inotify`, `pipe:`) processes of host uid
    `uid` hold (read from the host's /proc, as root)."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            n += sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(kind) for fd in os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return n


async def _concurrently(holder: str, observer: str, kind: str, count: int) -> tuple[bytes, bytes]:
    """Run `observer` in one sandbox while `holder` runs in another and holds `count` objects."""
    async with Sandbox(CFG) as a, Sandbox(CFG) as b:
        await a.start()
        await b.start()
        alone = (await b.run(observer)).output
        hold = asyncio.ensure_future(a.run(holder))
        for _ in range(200):  # until the holder has made its objects (not a fixed pause)
            if _held(a._uid.uid, kind) >= count:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the holder never held {count} {kind} objects")
        beside = (await b.run(observer)).output
        await hold
        return alone, beside


@pytest.mark.skipif(os.geteuid() != 0, reason="separate host uids need the harness to be root")
@pytest.mark.parametrize("holder,observer,kind,count", [
    # inotify instances are counted per host uid (max_user_instances); (select, not time.sleep:
    # Python's sleep fails under libfaketime, see docs/ENVIRONMENT.md)
    ("python3 -c 'import ctypes,select; l=ctypes.CDLL(None); fds=[l.inotify_init() for _ in range(37)]; select.select([], [], [], 2.5)'",
     "python3 -c 'import ctypes; l=ctypes.CDLL(None); n=0\nwhile l.inotify_init() >= 0: n += 1\nprint(n)'",
     "anon_inode:inotify", 37),
    # new pipes get a smaller buffer once a uid holds pipe-user-pages-soft pages of them
    ("ulimit -n 4096; python3 -c 'import os,select; p=[os.pipe() for _ in range(1100)]; select.select([], [], [], 2.5)'",
     "python3 -c 'import os,fcntl; r,w=os.pipe(); print(fcntl.fcntl(r, 1032))'", "pipe:", 2200),
], ids=["inotify", "pipe-size"])
def test_concurrent_sandboxes_cannot_pass_a_number_through_per_user_counters(holder, observer, kind, count):
    """Reproduced: a group member that solved the task held n inotify instances; a sibling that
    never read its data counted what was left and scored 1. Each live sandbox now runs as a
    host uid of its own, so no per-user counter is shared."""
    alone, beside = asyncio.run(_concurrently(holder, observer, kind, count))
    assert alone.strip() and alone == beside, f"a sibling's objects changed what another saw: {alone!r} -> {beside!r}"


def test_an_unbounded_harbor_verifier_is_clamped(tmp_path):
    """Reproduced: `timeout_sec = inf` (or 1e308) imported; the agent made /app/hello.txt a FIFO
    and the verifier never returned. Also: `inf` was written to the suite as `Infinity`, and
    every command then refused the whole suite."""
    folder = tmp_path / "hello-file"
    shutil.copytree(HARBOR / "hello-file", folder)
    toml = folder / "task.toml"
    for value in ("inf", "1e308"):
        toml.write_text(toml.read_text().replace("timeout_sec = 60.0", f"timeout_sec = {value}", 1)
                        .replace("timeout_sec = inf", f"timeout_sec = {value}", 1))
        task = import_harbor(tmp_path, semantics="isolated").tasks[0]
        assert task.verify_timeout_s == 86_400.0, value
        line = json.dumps(task.to_dict(), allow_nan=False)  # would raise on Infinity
        assert Task.from_dict(json.loads(line)) == task
    cfg = SandboxConfig(timeout_s=3, memory_mb=1024, max_procs=64, max_verify_s=2)
    record = asyncio.run(asyncio.wait_for(run_scripted(task, ["mkfifo /app/hello.txt"], cfg), 60))
    assert record.infra_error == "" and record.reward == 0.0, record


# ---------------------------------------------------------------------------------------------
# Bad input: one clear error, never a traceback, a hang or a broken protocol

BAD_LINES = {
    "workdir /tests": {"workdir": "/tests"}, "workdir app": {"workdir": "app"},
    "workdir /dev/shm/x": {"workdir": "/dev/shm/x"}, "workdir /run/obsspec": {"workdir": "/run/obsspec"},
    "workdir with a newline": {"workdir": "/app\nuntar 1 0 /etc"},
    "file ../../etc/x": {"files": {"../../etc/x": "hi"}}, "verify file /x": {"verify_files": {"/x": "hi"}},
    "setup with NUL": {"setup": "echo a\u0000b"}, "task id with a slash": {"task_id": "../../x"},
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_a_bad_suite_line_is_one_clear_error(tmp_path, name):
    good = task_by_id("dir-stats-00001").to_dict()
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({**good, **BAD_LINES[name]}) + "\n")
    with pytest.raises(SuiteError, match=r"train.jsonl:1: not a task: ") as e:
        load_tasks(str(tmp_path))
    assert "\n" not in str(e.value).replace("\\n", ""), str(e.value)


def test_duplicate_task_ids_in_a_suite_are_refused(tmp_path):
    a, b = task_by_id("dir-stats-00001").to_dict(), task_by_id("dir-stats-00002").to_dict()
    (tmp_path / "train.jsonl").write_text(json.dumps(a) + "\n")
    (tmp_path / "val.jsonl").write_text(json.dumps({**b, "task_id": a["task_id"]}) + "\n")
    with pytest.raises(SuiteError, match="dir-stats-00001 is also at .*train.jsonl:1"):
        load_tasks(str(tmp_path))


@pytest.mark.parametrize("key,value", [
    ("memory_mb", 1), ("memory_mb", 8), ("max_procs", 2), ("timeout_s", 1e-9), ("turn_seconds", 10**14),
    ("clock_start", 10**13), ("max_verify_s", float("inf")), ("timeout_s", float("nan")),
])
def test_limits_no_sandbox_can_run_with_are_refused(key, value):
    with pytest.raises(ValueError, match=f"sandbox.{key} must be"):
        SandboxConfig(**{key: value})


def test_a_pinned_clock_without_libfaketime_is_refused(monkeypatch):
    """Without libfaketime a deterministic sandbox ran on the real clock, without a word."""
    from obsspec.env import bwrap
    from obsspec.env.sandbox import SandboxUnavailable

    monkeypatch.setattr(bwrap, "faketime_lib", lambda: "")

    async def start():
        async with Sandbox(CFG) as sb:
            await sb.start()

    with pytest.raises(SandboxUnavailable, match="apt-get install faketime"):
        asyncio.run(start())
    cfg = SandboxConfig(timeout_s=3, memory_mb=1024, max_procs=64, deterministic=False)
    assert reward(task_by_id("dir-stats-00001"), [], cfg) == 0.0  # (runs, on the real clock)


def test_the_uid_lock_folder_must_be_ours(tmp_path):
    """The harness (root) creates lock files there: a folder another user can write to could hold
    links that make it create files elsewhere."""
    from obsspec.env.bwrap import HostUid

    folder = tmp_path / "locks"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(OSError, match="no one else can write"):
        HostUid(str(folder))
    folder.chmod(0o700)
    a, b = HostUid(str(folder)), HostUid(str(folder))
    assert a.uid != b.uid, "two live sandboxes got the same host uid"
    a.release()
    b.release()
