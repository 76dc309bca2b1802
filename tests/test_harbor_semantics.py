"""Harbor semantics (obsspec/env/semantics.py) through the real Podman backend: one example task
per class a Harbor task needs (heredocs, a service the agent starts, the image's own service,
root, one HOME, one clock, file times), each passing with its solution and failing without, and
failing under the isolated semantics too (what it would do without this mode); then each
behaviour on its own, and where the semantics show (`obsspec shell`, the suite's manifest)."""

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from conftest import podman_missing
from obsspec.env.episode import run_scripted, start_sandbox
from obsspec.env.harbor import import_harbor
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.task import Task

pytestmark = [pytest.mark.skipif(bool(podman_missing()), reason=podman_missing() or "-"),
              pytest.mark.usefixtures("podman_base")]

EXAMPLES = Path(__file__).parent.parent / "tasks" / "harbor-examples"
CLASSES = {  # example task -> the class of Harbor task it stands for
    "heredoc-inventory": "BuildKit heredocs in the Dockerfile",
    "web-service": "a service the agent starts and the verifier queries",
    "entrypoint-service": "a service the image's CMD starts",
    "root-admin": "root in the container (users, /etc, /var/log)",
    "home-config": "a config the agent makes in ~, read by the verifier",
    "clock-wait": "today's date and a wait on the wall clock",
    "stale-reports": "modification times the task is about",
}
CFG = SandboxConfig(timeout_s=20, memory_mb=1024, max_procs=64)
# a Harbor task of the base image, for the behaviours below (its verifier: a script of the test's)
BARE = Task("harbor-bare", "harbor:t", "Do it.", [], "exit 1", source="harbor:/bare", semantics="harbor")


def example(name: str, semantics: str = "harbor") -> Task:
    return import_harbor(EXAMPLES / name, semantics=semantics).tasks[0]


def scored(task: Task, commands: list[str], config=CFG) -> float:
    record = asyncio.run(run_scripted(task, commands, config))
    assert record.infra_error == "", f"{task.task_id}: an infrastructure error: {record.infra_error}"
    return record.reward


async def _session(task: Task, commands: list[str], verify: str | None = None, config=CFG):
    sandbox = await start_sandbox(task, config)
    try:
        results = [await sandbox.run(c) for c in commands]
        reward = await sandbox.verify(verify, {}, reward_file=False) if verify is not None else None
        return results, reward
    finally:
        await sandbox.close()


def session(commands: list[str], verify: str | None = None, config=CFG, task: Task = BARE):
    results, reward = asyncio.run(_session(task, commands, verify, config))
    return [r.output.decode() for r in results], results, reward


# ---------------------------------------------------------------------------------------------
# one example task per class


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_class_passes_with_its_solution_and_fails_without(name):
    task = example(name)
    assert task.harbor and task.needs_image
    assert scored(task, task.solution) == 1.0, f"{name} ({CLASSES[name]}): the reference solution failed"
    assert scored(task, []) == 0.0, f"{name}: doing nothing passed (or was not scored: see above)"


@pytest.mark.parametrize("name", sorted(set(CLASSES) - {"heredoc-inventory"}))
def test_under_the_isolated_semantics_each_class_fails_with_its_solution(name):
    """What these tasks did before Harbor semantics (the heredoc example failed at its build:
    tests/test_dockerfile.py). Scored 0 or timed out, never passed."""
    assert scored(example(name, "isolated"), example(name).solution) == 0.0, \
        f"{name}: passes in the isolated sandbox, so it does not stand for its class"


# ---------------------------------------------------------------------------------------------
# each behaviour


def test_services_live_on_across_commands_and_while_the_verifier_runs():
    start = ("(while :; do date +%s%N >> /tmp/beats; sleep 0.05; done) >/dev/null 2>&1 & "
             "nohup python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 & echo started")
    fetch = "python3 -c 'import urllib.request; urllib.request.urlopen(\"http://127.0.0.1:8123/\", timeout=5)'"
    # (a verifier given here, not the task's tests: the task says nothing of services, the recipe does)
    live = SandboxConfig(timeout_s=20, memory_mb=1024, max_procs=64, harbor_services="live")
    out, res, reward = session([start, f"sleep 1; {fetch} && echo up; wc -l < /tmp/beats"],
                               verify=f"n=$(wc -l < /tmp/beats); sleep 0.5; {fetch} && [ $(wc -l < /tmp/beats) -gt $n ]",
                               config=live)
    assert out[0] == "started\n"
    assert out[1].startswith("up\n") and int(out[1].split()[1]) >= 5, "a background job died with its command"
    assert reward == 1.0, "the services were not alive (or not serving) while the verifier ran"


def test_a_command_that_times_out_is_left_running_as_a_terminal_leaves_it():
    """A server started in the foreground (the agent never backgrounded it) keeps serving after
    its command's time is up, as it did in Harbor's terminal; the shell state of the command
    that timed out is not saved, and the episode goes on."""
    cfg = SandboxConfig(timeout_s=2, memory_mb=1024, max_procs=64, harbor_services="live")
    fetch = "python3 -c 'import urllib.request; urllib.request.urlopen(\"http://127.0.0.1:8124/\", timeout=5)'"
    out, res, reward = session(["cd /tmp && export STATE=saved && python3 -m http.server 8124 --bind 127.0.0.1",
                                f"pwd; echo ${{STATE:-unsaved}}; {fetch} && echo serving"],
                               verify=f"{fetch}", config=cfg)
    assert res[0].timed_out and res[0].exit_code == -1
    # (its log line for the request lands in the command that made it, as in a terminal)
    assert out[1].startswith("/app\nunsaved\n") and out[1].endswith("serving\n"), out[1]
    assert reward == 1.0, "the server its timed-out command left running was gone for the verifier"


def test_the_images_entrypoint_and_cmd_start_with_the_episode():
    task = example("entrypoint-service")
    # (the service may still be starting on a loaded machine: the command waits for it to answer)
    ask = ("for i in $(seq 300); do python3 -c 'import urllib.request; print(urllib.request.urlopen("
           "\"http://127.0.0.1:9000/kv/token\").read().decode())' 2>/dev/null && break; sleep 0.2; done")
    out, _, _ = session([ask], task=task)
    assert out[0] == "cd8124d7ea294afb\n", out[0]


def test_the_agent_is_root_in_a_user_namespace_of_its_own_without_host_privileges():
    out, _, _ = session(["id -u; cat /proc/self/uid_map; grep CapEff /proc/self/status",
                         "useradd -m tester && su tester -c 'id -un' && echo ok > /etc/obsspec-probe && cat /etc/obsspec-probe",
                         "mount -t tmpfs x /mnt 2>/dev/null; echo mount=$?; (echo h > /proc/sysrq-trigger) 2>/dev/null; "
                         "echo sysrq=$?; (echo 0 > /sys/kernel/mm/ksm/run) 2>/dev/null; echo sys=$?"])
    lines = out[0].split("\n")
    assert lines[0] == "0", "the agent is not root in the container"
    inside, host, size = map(int, lines[1].split())
    assert (inside, size) == (0, 65536) and host >= 2_200_000_000, f"root maps to host uid {host}: not a range of its own"
    caps = int(lines[2].split()[1], 16)
    assert caps & (1 << 21) == 0 and caps & (1 << 19) == 0, "the agent holds SYS_ADMIN or SYS_PTRACE"
    assert out[1] == "tester\nok\n", out[1]
    assert out[2] == "mount=32\nsysrq=1\nsys=1\n", f"the agent could mount or reach the host's kernel: {out[2]!r}"


def test_one_home_and_one_clock_for_agent_and_verifier():
    """The verifier's HOME is the agent's (its dotfiles are there), and both read the real clock:
    sleeps, waits and timeouts work (Python's time.sleep failed under the pinned clock)."""
    out, res, reward = session(
        ["echo hi > ~/.probe; date +%s | tee ~/.now; python3 -c 'import time; t = time.time(); time.sleep(0.3); print(round(time.time() - t, 1))'"],
        verify='[ "$(cat ~/.probe)" = hi ] && [ "$HOME" = /root ] && age=$(( $(date +%s) - $(cat ~/.now) )) && [ $age -ge 0 ] && [ $age -lt 60 ]')
    agent_now, slept = out[0].split()
    assert abs(int(agent_now) - time.time()) < 60, "the agent's clock is not the real one"
    assert slept == "0.3"
    assert reward == 1.0, "the verifier does not share the agent's HOME and clock"


def test_file_times_are_left_as_the_kernel_and_the_agent_set_them():
    out, _, _ = session(["touch -d '2001-02-03 04:05' old; touch new", "stat -c '%n %Y' old; echo $(( $(date +%s) - $(stat -c %Y new) ))"])
    name, when = out[1].split("\n")[0].split()
    assert int(when) == 981173100, "the time the agent set was re-stamped"
    assert 0 <= int(out[1].split("\n")[1]) < 60, "a new file does not carry the real time"


def test_the_harness_is_out_of_the_agents_sight_and_reach():
    """The agent's world has its own PID namespace: its PID 1 is the spawner (non-dumpable: no
    trace, no environ), which ignores signals from inside; PID 1 of the container, the relay and
    the verifier are not there to be seen, signalled or traced."""
    probe = ("ls /proc | grep -c '^[0-9]'; cat /proc/1/environ >/dev/null 2>&1; echo environ=$?; "
             "kill -9 1; kill -STOP 1; kill -TERM 1; echo signalled; "
             "python3 -c 'import ctypes; print(\"ptrace\", ctypes.CDLL(None, use_errno=True).ptrace(16, 1, 0, 0), ctypes.get_errno())'")
    # (SIGUSR1 is the timeout's signal: PID 1 ends the command that sent it, nothing else)
    out, res, _ = session([probe, "kill -USR1 1; sleep 5; echo not reached", "echo still here"])
    lines = out[0].split("\n")
    assert int(lines[0]) <= 6, f"the agent sees more processes than its own: {lines[0]}"
    assert lines[1:4] == ["environ=1", "signalled", "ptrace -1 1"], out[0]
    assert out[1] == "" and res[1].exit_code == 137 and res[1].seconds < 4, (out[1], res[1])
    assert out[2] == "still here\n", "a signal from the agent stopped its world's PID 1"


def test_background_output_never_reaches_the_harness_between_commands():
    """A service that writes to the terminal all the time: its output lands only in the
    observation of a command that is running, never in the reward or another request's answer."""
    chatty = "(while :; do printf 1; done) & echo started"
    out, _, reward = session([chatty, "sleep 0.2; echo done"], verify="exit 1")
    assert out[0].endswith("started\n") or "started" in out[0]
    assert reward == 0.0, "the service's output was read as the verifier's result"
    task = import_harbor(EXAMPLES / "hello-file").tasks[0]
    assert scored(task, [chatty]) == 0.0, "a chatty service made a reward file out of its output"
    assert scored(task, [*task.solution, chatty]) == 1.0


def test_obsspec_shell_and_the_suite_name_the_semantics(tmp_path):
    from obsspec.env.shell import shell_session
    from obsspec.env.suite import TasksConfig, prepare_tasks
    from obsspec.progress import NullDisplay

    lines = []
    summary = asyncio.run(shell_session(example("hello-file"), CFG, ["true"], lines.append, verify=False))
    assert summary["commands"] == 1
    header = lines[0]
    assert "# semantics: harbor\n" in header and "services" in header and "real clock" in header, header
    folder = tmp_path / "suite"
    for name in ("hello-file", "root-admin"):
        shutil.copytree(EXAMPLES / name, folder / name)
    (folder / "broken" / "tests").mkdir(parents=True)
    (folder / "broken" / "instruction.md").write_text("x\n")
    (folder / "broken" / "tests" / "test.sh").write_text("true\n")
    cfg = TasksConfig(builtin=False, harbor_dir=str(folder), val_fraction=0.0, workers=2, determinism_check=False)
    asyncio.run(prepare_tasks(cfg, CFG, str(tmp_path / "out"), NullDisplay()))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["semantics"] == {"harbor": 2} and manifest["tasks"]["harbor_semantics"] == "harbor"
    assert manifest["reasons"] == {"skipped: layout": 1}, manifest["reasons"]
    rows = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert {row["semantics"] for row in rows} == {"harbor"}


def test_without_services_in_its_tests_the_agents_processes_are_stopped_for_the_verifier():
    """`sandbox.harbor_services: auto` (the default): the task's tests name no service, so the
    agent's processes stay stopped while the verifier runs (they answer nothing, write nothing);
    `live` lets them run, as in Harbor."""
    start = "(while :; do date +%s%N >> /tmp/beats; sleep 0.05; done) >/dev/null 2>&1 & echo started"
    grows = "n=$(wc -l < /tmp/beats); sleep 0.5; [ $(wc -l < /tmp/beats) -gt $n ]"
    assert session([start], verify=grows)[2] == 0.0
    live = SandboxConfig(timeout_s=20, memory_mb=1024, max_procs=64, harbor_services="live")
    assert session([start], verify=grows, config=live)[2] == 1.0


def test_a_task_with_binary_and_large_files_and_solution_helpers_is_prepared_and_scored(tmp_path):
    """A task is its folder: a binary fixture and a 6 MB file copied into the image, a binary
    expected answer in tests/, a solve.sh that runs a helper of solution/ (unpacked at /solution,
    as Harbor does). prepare-tasks validates it (the solution scores 1, doing nothing 0) and
    writes its blobs; the suite read back scores the same."""
    from obsspec.env.suite import TasksConfig, load_tasks, prepare_tasks
    from obsspec.progress import NullDisplay

    folder = tmp_path / "src" / "binary-copy"
    data = bytes(range(256)) * 64 + b"\x00\xff"
    big = bytes((i * 7919) % 251 for i in range(6 << 20))
    for rel, content in {
        "task.toml": b"[metadata]\ncategory = 'files'\n[verifier]\ntimeout_sec = 60\n",
        "instruction.md": b"Write /app/out.bin: /app/data.bin twice, then /app/big.bin.\n",
        "environment/Dockerfile": b"FROM debian:12\nWORKDIR /app\nCOPY data.bin big.bin /app/\n",
        "environment/data.bin": data, "environment/big.bin": big,
        "tests/test.sh": b"#!/bin/bash\ncmp /app/out.bin /tests/expected.bin && echo 1 > /logs/verifier/reward.txt\n",
        "tests/expected.bin": data + data + big,
        "solution/solve.sh": b"#!/bin/bash\n/solution/twice.sh\n",
        "solution/twice.sh": b"#!/bin/bash\ncat /app/data.bin /app/data.bin /app/big.bin > /app/out.bin\n",
    }.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content)
    (folder / "solution" / "twice.sh").chmod(0o755)
    cfg = TasksConfig(builtin=False, harbor_dir=str(folder.parent), val_fraction=0.0, workers=1,
                      determinism_check=False, cheat_audit="flag")
    summary = asyncio.run(prepare_tasks(cfg, CFG, str(tmp_path / "suite"), NullDisplay()))
    assert summary["train"] == 1 and summary["dropped"] == 0, summary
    blobs = sorted(p.stat().st_size for p in (tmp_path / "suite" / "blobs").iterdir())
    assert blobs == sorted([len(data), len(big), len(data + data + big)])
    [task] = load_tasks(str(tmp_path / "suite"))
    assert scored(task, task.solution) == 1.0
    assert scored(task, ["cat /app/data.bin /app/data.bin > /app/out.bin"]) == 0.0
