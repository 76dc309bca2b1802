"""Reward hacks: every way we tried for an agent to influence its own reward, through the real
sandbox and the real verifiers. Each must leave the reward at what the task's truth says (0 for
an agent that did not solve the task) and must not turn a failure into an infrastructure error
(which would exclude the episode from the advantage instead of scoring it). The list, with the
reasoning, is in docs/REWARD_HACKS.md.
The Harbor examples run here with the isolated semantics (as the built-in families do); the
same attacks against Harbor semantics are tests/test_harbor_trust.py.
"""

import asyncio
import shutil
from pathlib import Path

import pytest

from obsspec.env.episode import run_scripted
from obsspec.env.harbor import import_harbor
from obsspec.env.sandbox import Sandbox, SandboxConfig
from obsspec.env.suite import task_by_id
from obsspec.env.task import Task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")

CFG = SandboxConfig(timeout_s=3, memory_mb=1024, max_procs=64)


@pytest.fixture(autouse=True)
def _every_backend(sandbox_backend, monkeypatch):
    """Each hack is tried in the bubblewrap sandbox, in a podman container, and in a bubblewrap
    sandbox on a Ray worker."""
    import sys

    from conftest import on_backend

    on_backend(sys.modules[__name__], monkeypatch, sandbox_backend)


HARBOR = Path(__file__).parent.parent / "tasks" / "harbor-examples"
EXIT0 = "printf 'import os\\nos._exit(0)\\n' > {}"


def reward(task, commands, config=None):
    record = asyncio.run(run_scripted(task, commands, config or CFG))  # (CFG: the backend's)
    assert record.infra_error == "", f"a hack turned a failure into an infra error: {record.infra_error}"
    return record.reward


def test_reference_still_passes_and_the_baseline_fails():
    """The hardening must not break honest episodes."""
    for task_id in ("json-edit-00004", "count-lines-00001", "fix-script-00002"):
        task = task_by_id(task_id)
        assert reward(task, task.solution) == 1.0, f"{task_id}: reference solution no longer passes"
        assert reward(task, []) == 0.0, f"{task_id}: doing nothing passes"


@pytest.mark.parametrize("task_id,module", [
    ("json-edit-00004", "json.py"), ("count-lines-00001", "subprocess.py"),
    ("json-edit-00004", "os.py"), ("count-lines-00001", "sys.py"),
])
def test_agent_files_do_not_shadow_the_verifiers_standard_library(task_id, module):
    # reproduced before the fix: json.py with os._exit(0) in /app gave json-edit reward 1
    assert reward(task_by_id(task_id), [EXIT0.format(module)]) == 0.0, \
        f"{module} in the workspace decided the verifier's result"


def test_python_startup_hooks_of_the_agent_are_ignored():
    hooks = ("mkdir -p ~/.local/lib/python3.11/site-packages ~/.local/lib/python3.12/site-packages && "
             "for d in ~/.local/lib/python3.*/site-packages; do printf 'import os\\nos._exit(0)\\n' > $d/usercustomize.py; "
             "echo 'import os; os._exit(0)' > $d/evil.pth; done; "
             f"{EXIT0.format('sitecustomize.py')}; {EXIT0.format('/tmp/sitecustomize.py')}; "
             "export PYTHONPATH=/app:/tmp PYTHONSTARTUP=/app/sitecustomize.py PYTHONHOME=/tmp; "
             "printf '#!/bin/sh\\nexit 0\\n' > python3 && chmod +x python3 && export PATH=/app:$PATH; "
             "echo 'exit 0' > ~/.bashrc; export BASH_ENV=~/.bashrc ENV=~/.bashrc")
    assert reward(task_by_id("json-edit-00004"), [hooks]) == 0.0, "an agent startup hook ran in the verifier"


def test_agent_module_run_by_the_verifier_cannot_decide_the_reward():
    task = task_by_id("fix-script-00002")
    module = next(p for p in task.files if not p.rsplit("/", 1)[-1].startswith("test_"))
    plant = ("import os\nos.makedirs('/logs/verifier', exist_ok=True)\n"
             "open('/logs/verifier/reward.txt', 'w').write('1')\nprint('\\n[]')\n")
    forks = "import os\nif os.fork() == 0:\n    open('/logs/verifier/reward.txt', 'w').write('1')\n"
    # reward 1 without these guards: plant, then make the judge fail before it
    # clears /logs — lock the directory, or have PID 1 kill the judge (SIGUSR1) — built-in
    # verifiers now report by exit status only
    locked = plant.replace("print('\\n[]')\n", "os.chmod('/logs/verifier', 0o555)\n")
    killed = plant.replace("print('\\n[]')\n", "import signal\nos.kill(1, signal.SIGUSR1)\nwhile True:\n    pass\n")
    for body in ("import os\nos._exit(0)\n", plant, forks, "print('OK')\nraise SystemExit(0)\n", locked, killed):
        cmd = f"cat > {module} <<'EOF'\n{body}EOF"
        assert reward(task, [cmd]) == 0.0, f"the agent's module decided its reward: {body!r}"


def test_planted_and_background_rewards_do_not_count():
    task = task_by_id("json-edit-00004")
    writer = ("mkdir -p /logs/verifier; (while true; do echo 1 > /logs/verifier/reward.txt; "
              "echo 'exit 0' > /run/obsspec-state/verifier/test.sh 2>/dev/null; "
              "echo 'exit 0' > /run/obsspec-state/cmd; sleep 0.01; done) & disown; "
              "nohup setsid bash -c 'while true; do echo 1 > /logs/verifier/reward.txt; done' >/dev/null 2>&1 &")
    tests = "mkdir -p /tests; echo 'exit 0' > /tests/test.sh; echo 1 > /tests/reward.txt"
    assert reward(task, [writer, tests]) == 0.0, "a reward written by the agent counted"


def test_a_fork_bomb_before_done_is_scored_not_excluded():
    task = task_by_id("json-edit-00004")
    bomb = ":(){ :|:& };:; (while :; do :; done) & disown"
    assert reward(task, [*task.solution, bomb]) == 1.0, "a fork bomb spoiled an honest reward"
    assert reward(task, [bomb]) == 0.0


def test_symlinks_into_the_verifiers_files_are_removed():
    hello = {t.task_id: t for t in import_harbor(HARBOR, semantics="isolated").tasks}["harbor-hello-file"]
    for target in ("/tests/expected_hello.txt", "../tests/expected_hello.txt",
                   "/proc/self/root/tests/expected_hello.txt", "/proc/self/fd/4"):
        got = reward(hello, [f"ln -sf {target} /app/hello.txt"])
        assert got == 0.0, f"a symlink to {target} made the verifier compare the expected file with itself"
    assert reward(hello, hello.solution) == 1.0


def test_what_the_agent_added_to_root_is_gone_when_the_verifier_runs():
    plant = ("for p in /pytest.ini /conftest.py /home/x /run/x; do echo '[pytest]' > $p; done; "
             "mkdir -p /evil/d; touch /evil/d/f; ls -A / | wc -l")
    check = ("for p in /pytest.ini /conftest.py /home/x /run/x /evil; do [ -e $p ] && exit 1; done; "
             "[ -z \"$(ls -A $TMPDIR)\" ] && [ -z \"$(ls -A $HOME)\" ] && [ \"$TMPDIR\" != /tmp ]")

    async def go():
        async with Sandbox(CFG) as sb:
            await sb.start()
            planted = await sb.run(plant)
            return planted, await sb.verify(check)

    planted, got = asyncio.run(go())
    assert planted.exit_code == 0
    assert got == 1.0, "files the agent put in / (or its HOME/TMPDIR) were visible to the verifier"


LOCKS = ("chmod -R a-w {d}", "chmod 000 {d}", "chmod 100 {d}", "chmod 555 {d}")


@pytest.mark.parametrize("lock", LOCKS)
def test_a_planted_reward_in_a_locked_directory_does_not_count(lock):
    """Reproduced before the janitor: the agent planted /logs/verifier/reward.txt (or the
    verifier's script in the state dir) and chmod'ed it undeletable; the old `find -delete`
    failed silently and dir-stats scored 1 without an answer. Now locked directories are opened,
    emptied and checked; what cannot be undone scores 0, never 1 and never an infra error."""
    task = task_by_id("dir-stats-00034")
    for plant in ("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && " + lock.format(d="/logs/verifier"),
                  "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && " + lock.format(d="/logs"),
                  "mkdir -p /run/obsspec-state/verifier && echo 'exit 0' > /run/obsspec-state/verifier/test.sh && "
                  + lock.format(d="/run/obsspec-state/verifier"),
                  "echo 1 > /dev/shm/reward && " + lock.format(d="/dev/shm")):
        assert reward(task, [plant]) == 0.0, f"a planted reward counted: {plant}"
    assert reward(task, [*task.solution, lock.format(d="/logs"), lock.format(d="/tests")]) == 1.0, \
        "locking the verifier's directories spoiled an honest reward"


@pytest.mark.parametrize("lock", LOCKS[1:])
def test_locked_directories_do_not_keep_links_or_root_files_for_the_verifier(lock, sandbox_backend):
    hello = {t.task_id: t for t in import_harbor(HARBOR, semantics="isolated").tasks}["harbor-hello-file"]
    link = "ln -sf /tests/expected_hello.txt /app/hello.txt"
    assert reward(hello, [f"{link}; {lock.format(d='/app')}"]) == 0.0, "a link in a locked workdir survived"
    assert reward(hello, [f"mkdir -p /app/a/b && ln -s /tests/expected_hello.txt /app/a/b/x && "
                          f"ln -s a/b/x /app/hello.txt && {lock.format(d='/app/a/b')} && {lock.format(d='/app/a')}"]) \
        == 0.0, "a link in a locked subdirectory survived"
    # locking /run or / after solving spoils nothing, except making them unsearchable: the modes
    # the agent set are put back, so no program (/) or no verifier script (/run) can be reached,
    # and the locked sandbox scores 0 (before, a locked / was an infra error: excluded at will).
    # A container's / and /run are root's and read-only: the agent can neither lock nor add to them.
    expected = 0.0 if lock == "chmod 000 {d}" and sandbox_backend != "podman" else 1.0
    assert reward(hello, [*hello.solution, f"echo x > /conftest.py; mkdir -p /run/x; {lock.format(d='/run')}; "
                                           f"{lock.format(d='/')}"]) == expected
    assert reward(hello, [*hello.solution, lock.format(d="/run")]) == expected
    got = asyncio.run(_verify_after(f"echo x > /conftest.py; {lock.format(d='/')}", "[ ! -e /conftest.py ]"))
    assert got == expected, "a file the agent added to a locked / was visible to the verifier"


def test_the_modes_the_agent_set_are_what_the_verifier_sees():
    """Opening locked directories to clean up must not change what a permissions verifier checks."""
    check = "[ \"$(stat -c %a /app/locked /app/open /app/open/f)\" = \"$(printf '500\\n751\\n640')\" ]"
    got = asyncio.run(_verify_after("mkdir -p locked open && touch open/f && chmod 640 open/f && "
                                    "chmod 751 open && chmod 500 locked", check))
    assert got == 1.0, "cleaning up before the verifier changed the modes the agent set"


async def _verify_after(command: str, check: str) -> float:
    async with Sandbox(CFG) as sb:
        await sb.start()
        assert (await sb.run(command)).exit_code in (0, 1)
        return await sb.verify(check)


def test_many_entries_or_a_lingering_big_process_are_not_infra_errors():
    """Both made `reset` fail (one `rm`/`realpath` fork per entry ran past its timeout; a killed
    1 GB process outlived a kill loop without pauses): infra errors the agent could cause at will,
    hiding its failures from the advantage. Now they are scored."""
    task = task_by_id("dir-stats-00034")
    cfg = SandboxConfig(timeout_s=5, memory_mb=2048, max_procs=64)
    many = "mkdir /x && cd /x && seq 40000 | xargs touch; python3 -c 'import os\nfor i in range(20000): os.symlink(\"/etc/passwd\", f\"/tmp/l{i}\")'"
    hog = "python3 -c 'import signal; x=b\"1\"*(900<<20); signal.pause()' & sleep 2"
    for hack in (many, hog):
        assert reward(task, [hack], cfg) == 0.0, hack
        assert reward(task, [*task.solution, hack], cfg) == 1.0, f"{hack} spoiled an honest reward"


def test_link_chains_deeper_than_path_max_or_through_dev_stdin_are_removed():
    """Reproduced with the first janitor: a chain of links whose composed path passed PATH_MAX
    reached /tests while Python's realpath lost track of it (Harbor hello-file reward 1); 1,100
    chained links crashed realpath (RecursionError: an infra error), 1,500 links 1,900 levels deep
    ran reset past its timeout. Links are now resolved the kernel's way, a component at a time."""
    hello = {t.task_id: t for t in import_harbor(HARBOR, semantics="isolated").tasks}["harbor-hello-file"]
    deep = ("import os\nos.chdir('/tmp'); os.mkdir('p'); os.chdir('p')\n"
            "for i in range(1000): os.mkdir('a'); os.chdir('a')\n"
            "os.symlink('a/'*1100+'t', 's2')\n"
            "for i in range(1100): os.mkdir('a'); os.chdir('a')\n"
            "os.symlink('/tests/expected_hello.txt', 't')\n"
            "os.symlink('p/'+'a/'*1000+'s2', '/tmp/s1')\n"
            "os.symlink('/tmp/s1', '/app/hello.txt')\n")
    assert reward(hello, [f"python3 -c \"{deep}\""]) == 0.0, "a link chain past PATH_MAX reached /tests"
    for target in ("/dev/stdin", "/dev/fd/3"):
        assert reward(hello, [f"ln -sf {target} /app/hello.txt"]) == 0.0, f"a link to {target} survived"
    task = task_by_id("dir-stats-00034")
    chain = "cd /tmp && for i in {1..1100}; do ln -s l$((i+1)) l$i; done"
    many_deep = 'd=$(printf "a/%.0s" {1..1900}); mkdir -p /tmp/$d && cd /tmp/$d && ln -s -t . /x{1..1500}'
    for hack in (chain, many_deep):
        assert reward(task, [*task.solution, hack]) == 1.0, f"{hack} spoiled an honest reward"


def test_the_agent_cannot_starve_pid1_or_feed_it_commands():
    """Reproduced: `prlimit --pid 1 --nofile=3` (the kernel allows it for the same uid, non-dumpable
    or not) and a FIFO in place of the command file the supervisor wrote each command to: both
    ended the episode as an infra error. Now a seccomp rule denies prlimit on other processes,
    and commands reach their shell on a pipe."""
    task = task_by_id("dir-stats-00034")
    for hack in ("prlimit --pid 1 --nofile=3", "prlimit --pid 1 --nproc=1 --as=12000000",
                 "rm -f /run/obsspec-state/cmd; mkfifo /run/obsspec-state/cmd",
                 "ln -sf /proc/1/fd/0 /run/obsspec-state/cmd"):
        assert reward(task, [*task.solution[:-1], hack, "echo next", task.solution[-1]]) == 1.0, hack
    own = asyncio.run(_run_all(["ulimit -n 100; ulimit -n", "prlimit --pid 1 --nofile=3; echo $?"]))
    assert own[0].output == b"100\n", "the agent's own limits must stay its to set"
    assert b"Operation not permitted" in own[1].output and own[1].output.endswith(b"1\n")


async def _run_all(commands: list[str]) -> list:
    async with Sandbox(CFG) as sb:
        await sb.start()
        return [await sb.run(c) for c in commands]


def test_the_loader_and_system_dirs_cannot_be_swapped_under_the_harness():
    """Reproduced: /lib64, /lib, /bin, /sbin were symlinks on the agent-owned root tmpfs; renaming
    a link to the agent's own dynamic loader over /lib64 made every program the harness started
    afterwards (janitor, tar, the verifier's bash) exit 0: reward 1 with no answer, on every
    task; `rm /lib64` made the episode an infra error. They are mount points now."""
    task = task_by_id("dir-stats-00034")
    swap = ("mkdir -p /tmp/l; for d in lib64 lib bin sbin; do ln -s /tmp/l /.n$d; "
            "python3 -c \"import os; os.rename('/.n$d', '/$d')\" 2>&1 | tail -1; rm -rf /$d; done; ls -ld /lib64")
    assert reward(task, [swap]) == 0.0, "swapping the loader decided the reward"
    assert reward(task, [*task.solution, swap]) == 1.0, "trying to swap the loader spoiled an honest reward"


def test_links_through_a_directory_locked_at_the_time_are_removed_and_modes_come_back():
    """Reproduced: a link through /tmp/d/.. (or ~/d/.., /run/obsspec/..) with that directory
    locked looked like a dead end to the janitor, which then opened /tmp/d for good: reward 1.
    Such links go now, and every mode the janitor changes is put back."""
    hello = {t.task_id: t for t in import_harbor(HARBOR, semantics="isolated").tasks}["harbor-hello-file"]
    for d in ("/tmp/d", "/home/agent/d", "/tmp/d/e"):
        up = "../" * d.count("/")
        plant = f"mkdir -p {d}; ln -s {d}/{up}tests/expected_hello.txt /app/hello.txt; chmod 000 {d}; chmod 000 /tmp/d"
        assert reward(hello, [plant]) == 0.0, f"a link through a locked {d} reached /tests"
    assert reward(hello, ["ln -s /run/obsspec/../../tests/expected_hello.txt /app/hello.txt; "
                          "chmod 000 /run/obsspec"]) == 0.0
    check = "[ \"$(stat -c %a /tmp/ro /tmp/ro2 /home/agent/ro /app/x)\" = \"$(printf '555\\n500\\n555\\n0')\" ]"
    got = asyncio.run(_verify_after("mkdir -p /tmp/ro /tmp/ro2 ~/ro /app/x; chmod 555 /tmp/ro ~/ro; "
                                    "chmod 500 /tmp/ro2; chmod 0 /app/x", check))
    assert got == 1.0, "the janitor changed modes outside the workspace"


def test_the_agent_cannot_deprioritise_pid1():
    """Reproduced: `chrt -i -p 0 1` with 100 busy loops kept PID 1 from answering the harness's
    timeout interrupt (infra error); `renice`/`taskset` on PID 1 and the session's autogroup
    nice were the milder forms. Scheduling calls on other processes are denied, and commands
    run in a session of their own."""
    out = asyncio.run(_run_all(["chrt -i -p 0 1; renice -n 19 -p 1; taskset -pc 0 1; "
                                "echo 19 > /proc/self/autogroup; cat /proc/1/autogroup",
                                "nice -n 5 echo nice && taskset -c \"$(taskset -pc $$ | sed 's/.*: //')\" echo pinned"]))
    text = out[0].output.decode()
    assert text.count("Operation not permitted") == 3, text
    assert text.rstrip().endswith("nice 0"), f"PID 1's autogroup was reniced: {text}"
    assert out[1].output == b"nice\npinned\n", "the agent's own nice/taskset must keep working"


def test_signal_driven_io_and_system_v_ipc_are_not_the_agents():
    """Reproduced: F_SETOWN -1 + O_ASYNC on the output pipe every command shares with the harness
    made SIGIO kill the janitor after the agent was dead (any failing episode became an infra
    error); 30 x 100 MB of System V shared memory stayed held, no process alive, past a 2 GB bound."""
    task = task_by_id("dir-stats-00034")
    owner = ("python3 -c 'import fcntl,os; fcntl.fcntl(1,fcntl.F_SETFL,fcntl.fcntl(1,fcntl.F_GETFL)|os.O_ASYNC); "
             "fcntl.fcntl(1,fcntl.F_SETOWN,-1)'; echo rc=$?")
    assert reward(task, [owner, "mv /home /h2 && mkdir -p /home/agent"]) == 0.0
    out = asyncio.run(_run_all([owner, "python3 -c 'import ctypes; print(ctypes.CDLL(None).shmget(0, 1<<20, 0o1600))'"]))
    assert b"PermissionError" in out[0].output and out[0].output.endswith(b"rc=1\n"), out[0].output
    assert out[1].output.strip() == b"-1", f"System V shared memory was granted: {out[1].output!r}"


def test_sandboxes_share_no_kernel_keys_and_keep_their_pipe_sizes():
    """Keys are kept per host uid, which every sandbox shares: an episode's key was readable in
    another running beside it. The key calls are denied, and
    so is shrinking a pipe (the output pipe shared with the harness fills sooner)."""
    keys = ("python3 -c 'import ctypes; lib = ctypes.CDLL(None); "
            "print(lib.syscall(248, b\"user\", b\"note\", b\"1234\", 4, -3), lib.syscall(250, 0, -3, 0))'")
    pipe = "python3 -c 'import fcntl; fcntl.fcntl(1, 1031, 4096)'; echo rc=$?"
    out = asyncio.run(_run_all([keys, pipe]))
    assert out[0].output.strip() == b"-1 -1", f"the kernel key store was reachable: {out[0].output!r}"
    assert b"PermissionError" in out[1].output and out[1].output.endswith(b"rc=1\n"), out[1].output


def test_harbor_reward_conversion_is_not_shadowed():
    scores = {t.task_id: t for t in import_harbor(HARBOR, semantics="isolated").tasks}["harbor-sum-scores"]
    plant = "printf 'open(\"/logs/verifier/reward.txt\", \"w\").write(\"1\")\n' > json.py"
    assert reward(scores, [plant]) == 0.0, "the agent's json.py ran in the reward.json conversion"
    assert reward(scores, scores.solution) == 1.0


def test_a_fifo_or_a_huge_file_is_the_agents_failure_not_ours():
    task = task_by_id("json-edit-00004")
    path = next(iter(task.files))
    cfg = SandboxConfig(timeout_s=1, memory_mb=1024, max_procs=64)
    assert reward(task, [f"rm {path} && mkfifo {path}"], cfg) == 0.0


def test_the_supervisor_cannot_be_stopped_or_read():
    """ptrace-stopping PID 1 used to hang the episode into an infra error (an excluded failure)."""
    probe = ("python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
             "print(l.ptrace(16, 1, 0, 0), ctypes.get_errno())'; head -c 1 /proc/1/mem; kill -STOP 1; kill -USR1 1")

    async def go():
        async with Sandbox(CFG) as sb:
            await sb.start()
            r = await sb.run(probe)
            return r, await sb.run("echo alive")

    r, after = asyncio.run(go())
    out = r.output.decode()
    assert out.startswith("-1 1\n"), f"the agent could ptrace PID 1: {out!r}"
    assert "Permission denied" in out, "the agent could read PID 1's memory"
    assert after.output == b"alive\n"


def test_writes_are_bounded_in_aggregate(sandbox_backend):
    cfg = SandboxConfig(timeout_s=5, memory_mb=1024, max_procs=64, workspace_mb=8, tmp_mb=4, home_mb=4)
    fill = ("for i in 1 2 3 4 5 6; do head -c 3000000 /dev/zero > f$i 2>/dev/null; done; du -sm . | cut -f1; "
            "head -c 9000000 /dev/zero > ~/h 2>/dev/null; du -sm ~ | cut -f1; "
            "head -c 9000000 /dev/zero > /x 2>/dev/null; head -c 9000000 /dev/zero > /run/obsspec-state/x 2>/dev/null; "
            "{ head -c 9000000 /dev/zero > /dev/x; } 2>/dev/null; df -m / /run/obsspec-state | awk 'NR>1{print $3}'")
    if sandbox_backend == "podman":  # a container's / is read-only: nothing of the agent's there
        fill = fill.replace("> /x 2>/dev/null", "2>/dev/null > /x").replace("df -m / ", "ls /x 2>/dev/null | wc -l; df -m ")

    async def go():
        async with Sandbox(cfg) as sb:
            await sb.start()
            return (await sb.run(fill)).output.decode().split()

    ws, home, root, state = map(int, asyncio.run(go()))
    assert ws <= 8 and home <= 4, f"workspace/HOME quota not enforced: {ws} MiB, {home} MiB"
    assert root <= 4 and state <= 16, f"/ or the harness's state dir unbounded: {root} MiB, {state} MiB"


def test_no_host_path_is_visible():
    async def go():
        async with Sandbox(CFG) as sb:
            await sb.start()
            return (await sb.run("cat /proc/self/mountinfo")).output.decode(), sb.host_root

    mountinfo, host_root = asyncio.run(go())
    assert host_root == "", "a bwrap episode keeps files on the host"
    roots = {line.split()[3] for line in mountinfo.splitlines()}
    leaked = {r for r in roots if r.startswith(("/tmp", "/work", "/root", "/home", "/var"))}
    assert not leaked, f"mountinfo shows host paths: {leaked}"


@pytest.mark.parametrize("task_id,command", [
    ("log-analysis-00003", "echo nan > answer.txt"), ("log-analysis-00007", "echo -nan > answer.txt"),
    ("awk-sum-00005", "echo NaN > summary.txt"), ("awk-sum-00005", "echo inf > summary.txt"),
])
def test_not_a_number_is_not_every_number(task_id, command):
    # reward 1 without the guard: `abs(nan - w) > tol` is False
    assert reward(task_by_id(task_id), [command]) == 0.0, f"{command!r} passed a numeric check"


def _harbor(verify: str, verify_files: dict | None = None) -> Task:
    return Task("harbor-probe", "harbor", "probe", [], verify, verify_files=verify_files or {},
                source="harbor:/probe")


def test_a_reward_file_written_before_the_verifier_was_killed_does_not_count():
    """A Harbor test.sh that runs the agent's code: that code wrote reward 1, then had PID 1 kill
    the verifier (SIGUSR1) before test.sh wrote the real result: reward 1 without the guard. A
    reward file counts only after a run nobody interrupted."""
    task = _harbor("bash /app/check.sh; echo 0 > /logs/verifier/reward.txt\n")
    attack = "printf 'echo 1 > /logs/verifier/reward.txt; kill -USR1 1; sleep 30\\n' > /app/check.sh"
    assert reward(task, [attack]) == 0.0, "a reward planted by a killed verifier's child counted"
    # 58, reproduced (reward 1 on both backends): the same code kills the shell running test.sh
    # (`kill -9 -1`, or its parent): nobody interrupted the run, but it ended by a signal
    for kill in ("kill -9 -1", "kill -9 $PPID"):
        attack = f"printf 'echo 1 > /logs/verifier/reward.txt; {kill}\\n' > /app/check.sh"
        assert reward(task, [attack]) == 0.0, f"a reward planted before `{kill}` counted"
    honest = _harbor("echo 1 > /logs/verifier/reward.txt\n")
    assert reward(honest, []) == 1.0, "an uninterrupted Harbor verifier's reward file was ignored"


def test_acls_left_on_the_verifiers_directories_are_the_agents_failure():
    """A default ACL of `---` on /tests made the directories the verifier's files unpack into
    unreadable: an infra error at will. Emptied places lose
    their ACLs with everything else."""
    task = _harbor("cmp -s /tests/data/x.txt /app/x.txt && echo 1 > /logs/verifier/reward.txt\n",
                   {"data/x.txt": "x\n"})
    acl = ("python3 -c 'import os, struct; os.setxattr(\"/tests\", \"system.posix_acl_default\", "
           "struct.pack(\"<I\", 2) + b\"\".join(struct.pack(\"<HHI\", t, 0, 0xFFFFFFFF) for t in (1, 4, 0x20)))'")
    assert reward(task, [acl]) == 0.0
    assert reward(task, [acl, "printf 'x\\n' > /app/x.txt"]) == 1.0


# Reward 1 without these guards: the judge's expected values were in the
# verifier script, on disk in the state dir (and open in the bash running it) for the agent's
# module to read while the judge ran it.
READ_THE_CASES = r"""import ast, glob, os, re
src = ""
for p in glob.glob("/run/obsspec-state/verifier/*") + glob.glob("/proc/[0-9]*/fd/*"):
    if p.startswith("/proc/%d/" % os.getpid()):
        continue
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(fd, 0, 0) if os.path.isfile(p) else None
        text = os.read(fd, 1 << 20).decode("utf-8", "replace")
        os.close(fd)
    except OSError:
        continue
    if "CASES = " in text:
        src = text
        break
m = re.search(r"^CASES = (.*)$", src, re.M)
table = {}
for call, exp in (ast.literal_eval(m.group(1)) if m else []):
    name, _, args = call.partition("(")
    table.setdefault(name, {})[args[:-1]] = exp
def _answer(name):
    return lambda *a: table[name][", ".join(map(repr, a))]
for name in table:
    globals()[name] = _answer(name)
"""


def test_the_agents_module_cannot_read_the_expected_values():
    task = task_by_id("fix-script-00002")
    module = next(p for p in task.files if not p.rsplit("/", 1)[-1].startswith("test_"))
    assert reward(task, [f"cat > {module} <<'EOF'\n{READ_THE_CASES}EOF"]) == 0.0, \
        "the module found the judge's expected values"
    assert reward(task, task.solution) == 1.0
