"""Scripted episodes: run a fixed list of commands for a task in a fresh sandbox.

Used to validate tasks (reference solution must pass, doing nothing must fail), to record the
reference trajectories that world models and warm starts train on, and by `obsspec shell -c`.
Each command's observation is formatted exactly as the agent sees it (obsspec.chat).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from obsspec import chat
from obsspec.env import podman, semantics
from obsspec.env.sandbox import ExecResult, Sandbox, SandboxConfig, SandboxError, SandboxUnavailable
from obsspec.env.task import Task, texts


@dataclass
class Step:
    command: str
    observation: str  # the observation body, exactly as the agent sees it
    exit_code: int
    seconds: float = field(default=0.0, compare=False)  # real tool latency (not deterministic)


@dataclass
class EpisodeRecord:
    task_id: str
    steps: list[Step]
    reward: float | None  # None when the episode hit an infrastructure failure
    infra_error: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> "EpisodeRecord":
        return cls(d["task_id"], [Step(**s) for s in d["steps"]], d["reward"], d.get("infra_error", ""))

    def to_dict(self, with_timing: bool = False) -> dict:
        d = asdict(self)
        if not with_timing:
            for s in d["steps"]:
                s.pop("seconds")
        return d


def observation(result: ExecResult, config: SandboxConfig) -> str:
    """The observation body for one command result (obsspec/chat.py: stdout and stderr, a cap, the exit code)."""
    return chat.format_observation(
        result.output, result.exit_code, timed_out=result.timed_out, timeout_s=result.timeout_s or config.timeout_s,
        cap=config.output_cap, total_bytes=result.total_bytes,
    )


def task_environment(task: Task) -> podman.Environment | None:
    """The container a task asks for (None: the recipe's backend, with its base image). Harbor
    semantics always run in a container (of the base image when the task names none)."""
    if not task.needs_image and not task.harbor:
        return None
    r = task.resources
    tests = "\n".join([task.verify, *texts(task.verify_files)])
    return podman.Environment(files=task.image_files, image=task.image, cpus=float(r.get("cpus", 0)),
                              memory_mb=int(r.get("memory_mb", 0)), storage_mb=int(r.get("storage_mb", 0)),
                              internet=bool(r.get("internet", False)), semantics=task.semantics,
                              etc_named=semantics.etc_named(tests), tests=tests)


def open_sandbox(config: SandboxConfig, workdir: str = "/app", environment: podman.Environment | None = None):
    """A sandbox where the recipe places it: here (`Sandbox`) or on a Ray worker (`RaySandbox`:
    the same methods, results and errors)."""
    if config.placement == "ray":
        from obsspec.env.ray_sandbox import RaySandbox

        return RaySandbox(config, workdir=workdir, environment=environment)
    return Sandbox(config, workdir=workdir, environment=environment)


async def preflight(config: SandboxConfig) -> None:
    """Fail fast, with one clear line, when sandboxes cannot start on this machine at all (with
    placement=ray: on a worker of the cluster, whose node the line names)."""
    sandbox = open_sandbox(config)
    try:
        await sandbox.start()
        await sandbox.run("true")
    except SandboxUnavailable:
        raise
    except SandboxError as e:
        what = "a podman container" if config.backend == "podman" else "a bubblewrap sandbox"
        where = "on the Ray cluster" if config.placement == "ray" else "here"
        raise SandboxUnavailable(f"cannot start {what} {where}: {e}") from None
    finally:
        await sandbox.close()


async def start_sandbox(task: Task, config: SandboxConfig) -> Sandbox:
    sandbox = open_sandbox(config, task.workdir, task_environment(task))
    try:
        await sandbox.start(files=task.files, setup=task.setup)
    except BaseException:
        await sandbox.close()
        raise
    return sandbox


async def verify_task(sandbox: Sandbox, task: Task) -> float:
    """The task's verifier, judged the way the task reports (exit status, or Harbor's reward file)."""
    return await sandbox.verify(task.verify, task.verify_files, task.verify_timeout_s or None,
                                reward_file=task.reward_file)


async def run_scripted(task: Task, commands: list[str], config: SandboxConfig,
                       verify: bool = True) -> EpisodeRecord:
    """Run `commands` in a fresh sandbox for `task`, then its verifier. Never raises for a
    sandbox failure: the record carries `infra_error` and `reward=None` instead."""
    steps: list[Step] = []
    try:
        sandbox = await start_sandbox(task, config)
    except SandboxUnavailable:
        raise  # the machine cannot sandbox at all: not one episode's failure
    except SandboxError as e:
        return EpisodeRecord(task.task_id, steps, None, f"setup: {e}")
    try:
        for command in commands:
            result = await sandbox.run(command)
            steps.append(Step(command, observation(result, config), result.exit_code, result.seconds))
        reward = await verify_task(sandbox, task) if verify else None
        return EpisodeRecord(task.task_id, steps, reward)
    except SandboxError as e:
        return EpisodeRecord(task.task_id, steps, None, str(e))
    finally:
        await sandbox.close()
