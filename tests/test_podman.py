"""The Podman backend: the bubblewrap sandbox's episode contract in a container (real podman,
real bash), images built offline from Dockerfiles (and rebuilt with their base), leftover
containers of a dead harness, Harbor tasks that need images, every built-in family, and lossless
speculation on container tasks. The reward-hack and fault suites (tests/test_reward_hacks.py,
tests/test_faults.py) run on both backends as well."""

import asyncio
import json
from pathlib import Path

import pytest

from conftest import podman_missing
from obsspec.env import images, podman
from obsspec.env.episode import run_scripted
from obsspec.env.harbor import import_harbor
from obsspec.env.sandbox import Sandbox, SandboxConfig, SandboxUnavailable
from obsspec.env.task import Task

pytestmark = [pytest.mark.skipif(bool(podman_missing()), reason=podman_missing() or "-"),
              pytest.mark.usefixtures("podman_base")]

CFG = SandboxConfig(backend="podman", timeout_s=3, memory_mb=512, max_procs=64)
TASKS = Path(__file__).parent / "fixtures" / "harbor_podman"


async def _episode(commands: list[str], config=CFG, environment=None, verify=None):
    async with Sandbox(config, environment=environment) as sb:
        await sb.start(files={"notes.txt": "hi\n"}, setup="mkdir -p data")
        results = [await sb.run(c) for c in commands]
        reward = await sb.verify(*verify) if verify else None
        return results, reward, sb


def run(commands, **kw):
    results, reward, _ = asyncio.run(_episode(commands, **kw))
    return [r.output.decode() for r in results], results, reward


def test_the_episode_contract_holds_in_a_container():
    out, res, _ = run(["id -un; id -u; hostname; pwd; ls", "cd data && export X=7 && f() { echo fn; }",
                       "echo $X; pwd; f", "(sleep 0.3; echo late > /tmp/late) & echo started",
                       "sleep 0.6; cat /tmp/late 2>&1; echo $?", "sleep 10", "echo alive; pwd"])
    assert out[0] == "agent\n1000\nsandbox\n/app\ndata\nnotes.txt\n", "not the agent's uid, host or workspace"
    assert out[2] == "7\n/app/data\nfn\n", "shell state did not persist between commands"
    assert out[4] == "cat: /tmp/late: No such file or directory\n1\n", "a background job outlived its command"
    assert res[5].timed_out and res[5].exit_code == -1 and res[5].seconds < 5
    assert out[6] == "alive\n/app/data\n", "the episode did not survive a timeout"


def test_no_network_read_only_root_and_bounded_writes():
    cfg = SandboxConfig(backend="podman", timeout_s=5, memory_mb=512, max_procs=64, workspace_mb=8)
    out, _, _ = run(["python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)' 2>&1 | tail -1",
                     "touch /x /usr/x 2>&1 | wc -l", "head -c 20000000 /dev/zero 2>/dev/null > big; echo $?; du -sm . | cut -f1",
                     "cat /proc/1/environ >/dev/null 2>&1; echo $?"], config=cfg)
    assert "Network is unreachable" in out[0] or "OSError" in out[0], f"the container reached the network: {out[0]}"
    assert out[1] == "2\n", "the container's root was writable"
    assert out[2].split()[0] != "0" and int(out[2].split()[1]) <= 8, f"workspace quota not enforced: {out[2]}"
    assert out[3] == "1\n", "the agent could read PID 1's environment (PID 1 must be non-dumpable)"


def test_memory_pids_and_cpu_are_the_containers_limits():
    env = podman.Environment(cpus=0.5, memory_mb=300)
    hog = "python3 -c 'b = bytearray(200 << 20); import time; time.sleep(1.5)'"
    cpu = ("python3 -c '\nimport os, resource, time\nfor _ in range(2):\n  if os.fork() == 0:\n"
           "    t = time.time()\n    while time.time() - t < 1.5: pass\n    os._exit(0)\n"
           "os.wait(); os.wait(); print(round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime, 2))'")
    cfg = SandboxConfig(backend="podman", timeout_s=5, memory_mb=512, max_procs=64, deterministic=False)
    out, res, _ = run([f"{hog} & {hog} & wait -n; echo $?; wait; echo done", ":(){ :|:& };:", "echo survived",
                       "cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes", cpu],
                      config=cfg, environment=env)
    assert "137" in out[0].split() or "1" in out[0].split(), f"two 200 MB hogs fit in 300 MB: {out[0]}"
    assert "Resource temporarily unavailable" in out[1] and out[2] == "survived\n", "a fork bomb was not contained"
    assert out[3].split() == ["64", str(300 << 20)], out[3]
    assert float(out[4]) < 2.0, f"--cpus 0.5 let two busy processes use {out[4]} s of CPU in 1.5 s"


def test_the_clock_and_file_times_are_pinned_and_episodes_repeat():
    commands = ["date +%s", "touch f; mkdir d", "stat -c '%n %Y' f d notes.txt", "ls -l --time-style=+%s"]
    first, _, _ = run(commands)
    second, _, _ = run(commands)
    start, step = CFG.clock_start, CFG.turn_seconds
    assert first[0] == f"{start + step}\n"
    assert first[2] == f"f {start + 2 * step}\nd {start + 2 * step}\nnotes.txt {start}\n", first[2]
    assert first == second, "two episodes of the same commands differed"


def test_the_verifier_starts_after_every_agent_process_and_reads_its_own_files():
    plant = ("ls /tests | wc -l; mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
             "(while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; done) & disown; echo planted")
    # passes only when the planted file is gone and stays gone (its writer is dead)
    check = "sleep 0.3; [ ! -e /logs/verifier/reward.txt ] && [ \"$(cat /tests/expected)\" = x ]"
    out, _, reward = run([plant], verify=(check, {"expected": "x\n"}, None))
    assert out[0] == "0\nplanted\n", "the verifier's files were visible during the episode"
    assert reward == 1.0, "an agent process or its planted reward outlived the episode into the verifier"
    _, _, planted = run([plant], verify=("exit 1", {}, None), )
    assert planted == 0.0


def test_closing_leaves_no_container_and_a_killed_one_is_an_infra_error():
    import os
    import signal

    from obsspec.env.sandbox import SandboxError

    async def go():
        sb = Sandbox(CFG)
        await sb.start()
        name = sb.container
        os.kill(sb._supervisor_pid, signal.SIGKILL)
        with pytest.raises(SandboxError):
            await sb.run("echo hi")
        await sb.close()
        return name

    name = asyncio.run(go())
    assert name not in podman.leftover_containers(), "a container outlived its episode"
    assert podman.leftover_containers() == []


def test_missing_podman_is_one_line_saying_how_to_install(monkeypatch):
    monkeypatch.setattr(podman.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match=r"apt-get install podman runc.*make install-podman"):
        asyncio.run(_episode([]))


def test_a_failed_build_is_one_line_naming_the_step():
    env = podman.Environment(files={"Dockerfile": "FROM debian:bookworm-slim\nRUN echo broken >&2 && exit 3\n"})
    with pytest.raises(images.ImageUnavailable, match="image build failed") as e:
        asyncio.run(_episode([], environment=env))
    assert "\n" not in str(e.value)


def test_harbor_image_tasks_pass_with_their_solution_and_fail_without():
    report = import_harbor(TASKS)
    assert list(dict(report.skipped)) == ["no-registry"]
    why = dict(report.skipped)["no-registry"]  # (no registry answers here: the pull was tried and failed)
    assert why.startswith("environment/Dockerfile: base image python:3.11-slim-bookworm is not here and "
                          "could not be pulled (") and "debian:bookworm-slim" in why and "\n" not in why
    cfg = SandboxConfig(timeout_s=20, memory_mb=512, max_procs=64)  # (bwrap backend: images still use podman)
    for task in report.tasks:
        assert task.needs_image and task.files == {}, task.task_id
        solved = asyncio.run(run_scripted(task, task.solution, cfg))
        idle = asyncio.run(run_scripted(task, [], cfg))
        assert (solved.reward, idle.reward) == (1.0, 0.0), (task.task_id, solved, idle)
        assert Task.from_dict(task.to_dict()) == task


def test_tasks_without_images_keep_their_suite_form():
    task = Task("t-1", "f", "do", ["ls"], "true")
    assert not {"image", "image_files", "resources"} & set(task.to_dict())
    with pytest.raises(ValueError, match="Dockerfile"):
        Task("t-2", "f", "do", [], "true", image_files={"a.txt": "x"})
    with pytest.raises(ValueError, match="resources"):
        Task("t-3", "f", "do", [], "true", image="debian:12", resources={"gpus": 1})


def test_task_images_follow_the_images_they_build_on():
    """A task image's name covers the IDs of its base images: a rebuilt base (new ID) gives new
    task images, never a stale one built on the old base."""
    files = {"Dockerfile": "FROM debian:bookworm\nRUN true\n"}
    etc = {"passwd": "agent:x:1000:1000::/home/agent:/bin/bash\n"}
    first = images.task_tag(files, "/app", etc, ["sha256:" + "a" * 64])
    assert first == images.task_tag(dict(files), "/app", dict(etc), ["sha256:" + "a" * 64]), "the tag is not stable"
    assert first != images.task_tag(files, "/app", etc, ["sha256:" + "b" * 64]), \
        "a rebuilt base image (another ID) kept the task image built on the old one"
    # the IDs are the images the FROM lines resolve to: our base for debian:12, none for a stage
    base = images.image_id(images.BASE_IMAGE)
    assert images.ensure_base() == base
    # the base records its package list: a base of another list is rebuilt (a new ID)
    fmt = f'{{{{index .Labels "{images.PACKAGES_LABEL}"}}}}'
    assert podman.podman("image", "inspect", "--format", fmt, base).stdout.strip() == ",".join(images.BASE_PACKAGES)
    staged = "FROM debian:12 AS build\nRUN true\nFROM build\nFROM scratch\n"
    assert images.base_ids(staged) == [base] and images.base_ids("FROM debian:bookworm-slim\n") == [base]
    with pytest.raises(images.ImageUnavailable, match="could not be pulled"):
        images.base_ids("FROM python:3.11-slim\n")


def test_the_first_container_of_a_process_removes_those_whose_harness_is_dead():
    """Containers left by a dead harness (labelled with its PID and start time) are removed when
    a new process starts its first container; a live owner's, or an unlabelled one, stays."""
    import os
    import subprocess
    import sys

    gone = subprocess.Popen(["true"])
    dead = f"{gone.pid}:{podman.process_start(gone.pid)}"
    gone.wait()
    me = podman.owner()
    reused = f"{os.getpid()}:{int(me.split(':')[1]) + 1}"  # this PID, another process's start time
    owners = {"dead": dead, "reused": reused, "live": me, "unlabelled": ""}
    names = {what: f"obsspec-sweep-{what}-{os.getpid()}" for what in owners}
    try:
        for what, label in owners.items():
            labels = ["--label", f"{podman.OWNER_LABEL}={label}"] if label else []
            started = podman.podman("run", "-d", "--name", names[what], "--label", f"{podman.LABEL}=1", *labels,
                                    "--pull=never", images.BASE_IMAGE, "sleep", "600")
            assert started.returncode == 0, started.stdout
        # a fresh harness process: its first sandbox sweeps
        episode = ("import asyncio\nfrom obsspec.env.sandbox import Sandbox, SandboxConfig\n"
                   "async def main():\n    async with Sandbox(SandboxConfig(backend='podman')) as sb:\n"
                   "        await sb.start()\n        print((await sb.run('echo hi')).output.decode(), end='')\n"
                   "asyncio.run(main())\n")
        root = str(Path(__file__).parent.parent)
        harness = subprocess.run([sys.executable, "-c", episode], capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])})
        assert harness.stdout == "hi\n", harness.stderr[-2000:]
        assert "removed 2 episode container(s) left by a harness that is gone" in harness.stderr, harness.stderr
        left = set(podman.leftover_containers())
        assert names["dead"] not in left, "a container whose harness died was left behind"
        assert names["reused"] not in left, "a container was kept because its owner's PID was reused"
        assert {names["live"], names["unlabelled"]} <= left, "a container of a live (or unknown) owner was removed"
        assert podman.remove_orphans() == [], "a second sweep found more to remove"
    finally:
        podman.podman("rm", "-f", "-t", "0", "--ignore", *names.values())

    async def episode_owner():
        async with Sandbox(CFG) as sb:
            await sb.start()
            label = f'{{{{index .Config.Labels "{podman.OWNER_LABEL}"}}}}'
            return podman.podman("inspect", "--format", label, sb.container).stdout.strip()

    assert asyncio.run(episode_owner()) == me, "an episode container does not name its harness"


def test_every_builtin_family_validates_in_a_container(tmp_path):
    """`prepare-tasks` with sandbox.backend=podman, one instance per family: each reference
    solution passes its verifier in the base image, doing nothing fails, and the observations
    repeat (the base image holds every tool the families' setups and solutions use)."""
    from obsspec.env.families import all_families
    from obsspec.env.suite import TasksConfig, prepare_tasks
    from obsspec.progress import NullDisplay

    families = sorted(all_families())
    cfg = TasksConfig(num_instances=len(families), val_fraction=0.0, workers=4)
    summary = asyncio.run(prepare_tasks(cfg, SandboxConfig(backend="podman"), str(tmp_path), NullDisplay()))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["dropped"] == [], f"families that do not validate in the base image: {manifest['dropped']}"
    assert sorted(manifest["families"]) == families and summary["train"] == len(families)
    assert summary["commands_differing"] == 0, json.loads((tmp_path / "determinism.json").read_text())["differing"]


def test_speculation_is_lossless_on_container_tasks():
    """The method's first invariant on the Harbor image tasks, sandbox.backend=podman: with a
    scripted policy (tests/fakes.py), speculative rollouts, on drafts that all match (an oracle)
    and on drafts every other one of which is spoiled (rollbacks), give the token ids, masks,
    logprobs and rewards of the sequential rollouts."""
    from fakes import ByteTokenizer, ScriptedPolicy
    from obsspec.rollout.events import EventBus
    from obsspec.rollout.predictors import Corrupting
    from obsspec.rollout.scheduler import Sampling, Scheduler
    from obsspec.rollout.tools import EmulatedLatency, SandboxTool
    from obsspec.tokens import ChatFormat
    from test_rollout import Recording, assert_accounted, assert_lossless, oracle_from

    tasks = import_harbor(TASKS).tasks
    commands = ["ls", "pwd", "echo {h} >> log.txt; tail -n 2 log.txt", "cat nope-{h}",
                *{c for t in tasks for c in t.solution}]
    cfg = SandboxConfig(backend="podman", timeout_s=10, output_cap=512, memory_mb=512, max_procs=64)
    slow_tool = EmulatedLatency("fixed", 0.4)  # slower than a scripted action: speculation runs ahead
    episodes = [t for t in tasks for _ in range(2)]

    def rollout(speculative, predictor=None):
        tok = ByteTokenizer()
        bus, rec = EventBus(), Recording()
        bus.subscribe(rec)
        sampling = Sampling(max_turns=5, max_new_tokens=400, max_context=6000, seed=5)
        sched = Scheduler(ScriptedPolicy(tok, commands, done_after=4), ChatFormat(tok), bus, sampling,
                          cap=cfg.output_cap, predictor=predictor)
        make_tool = lambda task, episode: SandboxTool(task, episode, cfg, slow_tool)  # noqa: E731
        return asyncio.run(sched.run_batch(episodes, make_tool, speculative)), rec

    seq, _ = rollout(False)
    assert {t.reward for t in seq} == {0.0, 1.0}, "the scripted policy should both solve and fail tasks"
    for predictor in (oracle_from(tasks, seq, group=2), Corrupting(oracle_from(tasks, seq, group=2), every=2)):
        spec, rec = rollout(True, predictor)
        assert_lossless(seq, spec)
        assert_accounted(rec)
        kinds = rec.kinds()
        assert kinds["spec_start"] > 0 and kinds["match"] > 0, f"speculation never ran ({predictor.name}): {kinds}"
        if predictor.name.endswith("corrupt2"):
            assert kinds["rollback"] > 0, f"no rollback with spoiled drafts: {kinds}"


# (queues made with the default attributes: about 80 KB each against RLIMIT_MSGQUEUE's 800 KB)
QUEUES = ("python3 -c 'import ctypes,os\nl=ctypes.CDLL(\"librt.so.1\")\nn=0\n"
          "while n < {most} and l.mq_open(f\"/q{{n}}\".encode(), os.O_CREAT | os.O_RDWR, 0o600, None) >= 0: n += 1\n"
          "print(n)\nfor i in range({unlink} and n): l.mq_unlink(f\"/q{{i}}\".encode())'")
IO_URING = ("python3 -c 'import ctypes,os; l=ctypes.CDLL(None,use_errno=True)\n"
            "print(l.syscall(425, 8, ctypes.create_string_buffer(256)), os.strerror(ctypes.get_errno()))'")


def test_no_user_namespaces_io_uring_or_queues_shared_between_siblings(sandbox_backend):
    """Reproduced in containers: `unshare -Ur` (and a tmpfs mounted in it) worked, io_uring
    answered, and POSIX message queues, which outlive the agent's processes and are counted per
    host uid (every container is uid 1000), passed a number: with 6 queues held by one episode, a
    sibling running beside it could open 3 instead of 9 (and the host's uid 1000 none). The
    profile is now the runtime's default with the sandbox's rules; mq_open and io_uring are
    denied on both backends (bwrap never had user namespaces)."""
    cfg = SandboxConfig(backend=sandbox_backend, timeout_s=10, memory_mb=512, max_procs=64)

    async def siblings():
        async with Sandbox(cfg) as a, Sandbox(cfg) as b:
            await asyncio.gather(a.start(), b.start())
            alone = (await b.run(QUEUES.format(most=50, unlink=1))).output
            held = (await a.run(QUEUES.format(most=6, unlink=0))).output  # (kept after the command)
            beside = (await b.run(QUEUES.format(most=50, unlink=1))).output
            ns = [(await a.run(c)).output.decode() for c in
                  ("unshare -Ur id -u 2>&1; echo $?", "unshare -Urm mount -t tmpfs x /tmp 2>&1; echo $?", IO_URING)]
            return alone, held, beside, ns

    alone, held, beside, ns = asyncio.run(siblings())
    assert alone == beside, f"a sibling's queues changed how many another could open: {alone!r} -> {beside!r}"
    assert held == b"0\n", f"an episode made POSIX message queues: {held!r}"
    assert all(out.endswith("\n1\n") for out in ns[:2]), f"a user namespace was made: {ns[:2]}"
    assert ns[2] == "-1 Operation not permitted\n", f"io_uring was reachable: {ns[2]!r}"


def test_the_tmpfs_mounts_leave_the_harness_memory_in_every_container():
    """The tmpfs data is charged to the container's memory and nothing frees it before
    verification: with tiny-cpu's sizes (1,760 MB) in 2 GB, or a Harbor task's `storage = "4G"`
    in `memory = "1G"`, filling them left the janitor nothing."""
    sizes = lambda argv: sum(int(a.split("size=")[1].split("m")[0]) for a in argv if "size=" in a)  # noqa: E731
    for memory, storage in ((2048, 0), (1024, 4096), (256, 0), (128, 100_000)):
        env = podman.Environment(memory_mb=memory, storage_mb=storage)
        cfg = SandboxConfig(backend="podman", memory_mb=memory)
        room = memory - min(podman.HARNESS_MEMORY_MB, memory // 4)
        assert sizes(podman.argv(cfg, "/app", "img", env, "n", {}, None, "")) <= room, (memory, storage)
        harbor = podman.harbor_argv(cfg, "/app", "img", env, "n", {}, "", None)
        # (the agent can write only the overlay's upper tmpfs; the rest is the harness's and the verifier's)
        assert sizes(harbor) - cfg.tmp_mb - 1 - 16 <= room, (memory, storage)


def test_memory_the_agents_files_hold_at_verification_scores_zero_never_infra():
    """Reproduced: every tmpfs filled and 650,000 empty files (their inodes are charged to the
    container's memory, and podman 4.3.1 takes no nr_inodes): the janitor was OOM-killed, 'could
    not clean up before verification', an infra error at will. Now the tmpfs sizes fit with room
    to spare, the OOM killer takes the agent's processes and the janitor before PID 1, and a
    janitor it took scores 0."""
    from obsspec.env.suite import task_by_id

    task = task_by_id("dir-stats-00001")
    cfg = SandboxConfig(backend="podman", timeout_s=30, memory_mb=256, max_procs=64)
    fill = "for d in /app /tmp ~ /dev/shm; do head -c 300M /dev/zero > $d/fill; done 2>/dev/null; echo filled"
    files = ("python3 -c 'import os\nos.mkdir(\"/app/{0}\")\nfor i in range(120000): "
             "os.close(os.open(f\"/app/{0}/{{i}}\", os.O_CREAT | os.O_WRONLY))'; echo made")
    record = asyncio.run(run_scripted(task, [fill, files.format("a"), files.format("b")], cfg))
    assert record.infra_error == "" and record.reward == 0.0, record.infra_error
