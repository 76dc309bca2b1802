"""Import Harbor (Terminal-Bench 2) task folders as obsspec `Task`s.

    report = import_harbor("datasets/my-bench")   # a folder of task folders, or one task folder
    for name, why in report.skipped:
        print(f"skipped {name}: {why}")
    report.counts()                               # {"base-image": 12, "compose": 3, ...}
    tasks = report.tasks                          # list[Task], in folder-name order
    report.unsupported                            # {"agent.timeout_sec": 40, ...}: set, not honoured
    report.network                                # {"public (as authored)": 3, ...}

task.toml is read by the harbor package's own model (`harbor.models.task.config.TaskConfig`):
its validation, defaults (a 600 s verifier) and migrations (memory, storage, allow_internet ->
network_mode) are Harbor's. The fields obsspec honours are SUPPORTED; any other field a task sets
is counted by name in the import report and the task runs without it. A multi-step trial, a
non-Linux task and one that needs GPUs or TPUs are skipped.

How a Harbor task folder maps onto a `Task`:

    count-words/                 Task(task_id="harbor-count-words",
      task.toml                       family="harbor:" + [metadata] category or "uncategorised",
      instruction.md           ->     instruction=<instruction.md, stripped>,
      environment/setup.sh     ->     setup=<setup.sh>  (cwd = workdir, before the agent starts),
      environment/data.txt     ->     files={"data.txt": ...}  (same path in the workspace),
      environment/Dockerfile   ->     workdir=<[environment] workdir, else its last WORKDIR, else "/app">,
        (without setup.sh)     ->     image_files=<every file of environment/: the build context>,
      [environment] docker_image ->   image=<it>  (without Dockerfile and setup.sh),
      [environment] cpus, memory_mb, storage_mb, network_mode (allow_internet)
                               ->     resources={"cpus", "memory_mb", "storage_mb", "internet"},
      solution/solve.sh        ->     solution=[<solve.sh>]  (one multi-line command; [] if none),
      tests/test.sh, tests/*   ->     verify="cd <workdir> && bash /tests/test.sh; ...",
                                      verify_files={"test.sh": ..., "expected_total": ...},
      [verifier] timeout_sec   ->     verify_timeout_s=<it>  (Harbor's default: 600),
                                      source="harbor:/abs/path/count-words")

Decisions:
- Every task imports with Harbor semantics (obsspec/env/semantics.py: it runs as Harbor runs it,
  in a container: services live on, the image's USER and CMD, one HOME and the real clock),
  unless `semantics="isolated"` asks for the built-in families' sandbox.
- A task with an image (environment/Dockerfile, or `[environment] docker_image`) runs in a
  Podman container of it (obsspec/env/images.py): environment/ is the build context, not
  workspace files. The image is built when an episode first needs it; a base image that cannot
  be had offline (only Debian 12 is built locally; no registry) skips the task here, naming it.
  BuildKit heredocs are translated at build time (obsspec/env/dockerfile.py); one that cannot be
  translated faithfully skips the task. docker-compose (several services) is skipped.
- `environment/setup.sh` (our extension) stands in for the image where it exists: the task then
  runs in the recipe's sandbox, the Dockerfile is read only for WORKDIR, and its RUN/COPY lines
  are NOT executed, so setup.sh must do their work. Other files of environment/ are copied into
  the workspace at the same relative path, whatever the Dockerfile's COPY said.
- Image tasks get `[environment]` cpus, memory and storage as their container's limits
  (storage: the workspace tmpfs), and a network only when task.toml asks for one explicitly
  (`network_mode = "public"`, or `allow_internet = true`), for the whole episode, verifier
  included. Harbor's default (public when unset), an allowlist and a per-role policy run without
  one here; the report counts each (`ImportReport.network`).
- Rewards: the sandbox reads /logs/verifier/reward.txt; a verifier that writes reward.json instead
  (`{"reward": x}`) has it converted by the verify script. `[verifier] env` is exported for
  test.sh and `[solution] env` at the top of the solution command.
- A task is its folder: any file of environment/ and tests/, text or binary (images, databases,
  archives: a `Blob`, kept in the suite's blobs/ by its sha256), up to 256 MB in all
  (taskfolder.MAX_TASK_BYTES). A symlink leaving the folder, or a solve.sh that needs other files
  of solution/ (not mounted here), skips the task.
- File modes: tasks hold contents, not modes, so a file that is executable in the task folder gets
  `chmod +x` at the top of setup (environment/) or of the verify script (tests/): a test.sh that
  runs `/tests/helper.sh` directly, or an instruction that says `./run.sh`, works as in Docker.
- `[verifier] timeout_sec` is the verifier's time limit (`Task.verify_timeout_s`, at most a day
  in the suite, and at run time at most the recipe's `sandbox.max_verify_s`).
- A malformed task folder never raises: it becomes a `skipped` entry with a one-line reason,
  counted by its class (`ImportReport.counts()`).
  `HarborImportError` means the path itself is wrong (missing, or holds no task folder at all).
"""

from __future__ import annotations

import base64
import math
import os
import posixpath
import re
import shlex
import tomllib
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from obsspec.env import bwrap, dockerfile, images
from obsspec.env.semantics import HARBOR, ISOLATED, check as check_semantics
from obsspec.env.task import Task, check_workdir
from obsspec.env.taskfolder import (Skip, check_tree, executable_files, file_names, one_line, read_text,
                                    read_tree)

SOLUTION_MAX = 4 << 20  # solution/ with helpers, as a tar archive: it reaches the sandbox as a command
MAX_SIZE_MB = 1 << 20   # a task's memory or storage: at most 1 TiB (inf overflowed int())
MAX_VERIFY_TIMEOUT_S = 86_400.0  # a task's own limit, kept finite (JSON has no infinity)
DEFAULT_WORKDIR = "/app"  # what Harbor images usually use
DOCKER_FILES = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml")
NOT_COPIED = {*DOCKER_FILES, ".dockerignore", "setup.sh"}  # environment/ files kept out of /app
TASK_MARKERS = ("task.toml", "instruction.md", "tests", "environment", "solution")

# Run after test.sh; Harbor verifiers may write reward.json where the sandbox reads reward.txt.
REWARD_JSON_TO_TXT = """\
if [ ! -f /logs/verifier/reward.txt ] && [ -f /logs/verifier/reward.json ]; then
  python3 -I - <<'EOF'  # -I: the agent's json.py in cwd cannot shadow the stdlib
import json
try:
    data = json.load(open("/logs/verifier/reward.json"))
    if isinstance(data, dict):
        data = data.get("reward", next(iter(data.values())) if len(data) == 1 else None)
    reward = float(data)
except Exception:  # an unreadable reward is no reward
    reward = 0.0
open("/logs/verifier/reward.txt", "w").write(f"{reward}\\n")
EOF
fi
"""


class HarborImportError(ValueError):
    """The path given is not a Harbor task folder nor a folder of them."""


@dataclass
class ImportReport:
    tasks: list[Task] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(folder name, one-line reason) for every task folder that could not be imported."""
    kinds: dict[str, str] = field(default_factory=dict)
    """folder name -> the class of its skip reason (SKIP_KINDS)."""
    unsupported: Counter = field(default_factory=Counter)
    """task.toml field (section.key) -> how many imported tasks set it and run without it here."""
    network: Counter = field(default_factory=Counter)
    """how the imported tasks' [environment] network_mode reads, and what runs here (NETWORK)."""

    def counts(self) -> dict[str, int]:
        """How many folders each class of reason cost, largest first."""
        return dict(Counter(self.kinds[name] for name, _ in self.skipped).most_common())




def import_harbor(path: str | os.PathLike, semantics: str = HARBOR) -> ImportReport:
    """Import one Harbor task folder, or every task folder directly inside `path` (by name), with
    `semantics` (obsspec/env/semantics.py: `harbor`, as Harbor runs them, or `isolated`)."""
    check_semantics(semantics)
    root = Path(path)
    if not root.is_dir():
        problem = "not a directory" if root.exists() else "no such directory"
        raise HarborImportError(f"{path}: {problem} (expected a Harbor task folder or a folder "
                                f"of them)")
    if any((root / m).exists() for m in ("task.toml", "instruction.md", "tests/test.sh")):
        folders = [root]
    else:
        folders = sorted(c for c in root.iterdir() if c.is_dir() and not c.name.startswith("."))
        if not any((c / m).exists() for c in folders for m in TASK_MARKERS):
            raise HarborImportError(f"{path}: no Harbor task folders in it (a task folder holds "
                                    f"task.toml, instruction.md and tests/test.sh)")
    report, owner = ImportReport(), {}
    for folder in folders:
        try:
            task, unsupported, network = _import_task(folder, "" if semantics == ISOLATED else semantics)
            if task.task_id in owner:  # two names can sanitise to the same id
                raise Skip(f"task id {task.task_id!r} is already taken by {owner[task.task_id]}", "layout")
        except Skip as e:
            report.skipped.append((folder.name, one_line(str(e))))
            report.kinds[folder.name] = e.kind
            continue
        except Exception as e:  # noqa: BLE001
            # Whatever else a hostile folder breaks costs that folder, never the whole import.
            report.skipped.append((folder.name, one_line(f"cannot import: {type(e).__name__}: {e}")))
            report.kinds[folder.name] = "unreadable"
            continue
        owner[task.task_id] = folder.name
        report.tasks.append(task)
        report.unsupported.update(unsupported)
        report.network[network] += 1
    return report


def _import_task(folder: Path, semantics: str) -> tuple[Task, list[str], str]:
    """The task, the task.toml fields it sets that run without effect here, and its network."""
    folder = folder.resolve()
    for rel, what in [("task.toml", "its configuration"), ("instruction.md", "the prompt"),
                      ("tests/test.sh", "the verifier entry point")]:
        if not (folder / rel).is_file():
            raise Skip(f"missing {rel} ({what})", "layout")
    check_tree(folder)  # before reading anything: a symlink could point at host secrets
    config, model = _read_config(read_text(folder, "task.toml"))
    unsupported = _unsupported(model)
    instruction = read_text(folder, "instruction.md").strip()
    if not instruction:
        raise Skip("instruction.md is empty", "layout")
    slug = _slug(folder.name)
    if not slug:
        raise Skip("folder name has no letters or digits to make a task id from", "layout")
    category = _table(config, "metadata").get("category") or "uncategorised"
    if not isinstance(category, str):
        raise Skip("task.toml: metadata.category must be a string", "task.toml")
    timeout = model.verifier.timeout_sec  # (Harbor's default when unset)
    if not (math.isfinite(timeout) or timeout == math.inf) or timeout <= 0:
        raise Skip(f"task.toml: verifier.timeout_sec must be a positive number, not {timeout!r}", "task.toml")
    timeout = min(float(timeout), MAX_VERIFY_TIMEOUT_S)  # (the recipe's sandbox.max_verify_s bounds it at run time)
    files, setup, workdir, image = _environment(folder, _table(config, "environment"))
    if model.environment.workdir:  # [environment] workdir overrides the image's WORKDIR, as in Harbor
        workdir = posixpath.normpath(model.environment.workdir)
        try:
            check_workdir(workdir)
        except ValueError:
            raise Skip(f"task.toml: environment.workdir {workdir} cannot be the sandbox workspace", "task.toml") from None
    network = _network(model)
    if network == "public" and image:
        image.setdefault("resources", {})["internet"] = True
    task = Task(
        task_id=f"harbor-{slug}", family=f"harbor:{_slug(category) or 'uncategorised'}",
        instruction=instruction, solution=_solution(folder, _env(config, "solution"), semantics),
        verify=_verify_script(workdir, _env(config, "verifier"), executable_files(folder, "tests")),
        verify_files=read_tree(folder, "tests"), files=files, setup=setup, workdir=workdir,
        source=f"harbor:{folder}", verify_timeout_s=timeout, semantics=semantics, **image,
    )
    return task, unsupported, NETWORK[network] if image else NETWORK["sandbox"]


def _read_config(text: str) -> tuple[dict, "TaskConfig"]:
    """task.toml as a table (for the checks Harbor's model does not make) and as Harbor's own
    `TaskConfig` (the harbor package: what every field means, its defaults and migrations)."""
    from harbor.models.task.config import TaskConfig
    from pydantic import ValidationError

    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # its message says which line and column
        raise Skip(f"invalid task.toml: {e}", "task.toml") from None
    env = _table(config, "environment")
    _resources(env)  # sizes Harbor would drop or overflow on (memory = inf) are one-line skips first
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # (memory, storage, allow_internet)
            model = TaskConfig.model_validate(config)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "task.toml"
        raise Skip(f"task.toml: {where}: {first['msg']}", "task.toml") from None
    if model.steps:
        raise Skip(f"task.toml: a multi-step trial ({len(model.steps)} [[steps]]) is not supported", "multi-step")
    if model.environment.os.value != "linux":
        raise Skip(f"task.toml: environment.os = {model.environment.os.value!r} (only linux runs here)", "os")
    if model.environment.gpus or model.environment.gpu_types or model.environment.tpu:
        raise Skip("task.toml: the task needs GPUs or TPUs (environment.gpus/gpu_types/tpu)", "accelerators")
    return config, model


# Fields of Harbor's task model that obsspec honours; any other field a task sets is counted in the
# import report (ImportReport.unsupported) and the task runs without it.
SUPPORTED = {"schema_version", "task", "source", "metadata", "verifier.timeout_sec", "verifier.env",
             "solution.env", "environment.docker_image", "environment.cpus", "environment.memory_mb",
             "environment.storage_mb", "environment.network_mode", "environment.workdir",
             "environment.build_timeout_sec"}


def _unsupported(model) -> list[str]:
    """The `section.key` fields `model` sets away from Harbor's defaults that obsspec does not honour."""
    out = []
    for section, value in model.model_dump(exclude_defaults=True, mode="json").items():
        keys = [f"{section}.{k}" for k in value] if isinstance(value, dict) and section != "metadata" else [section]
        out += [k for k in keys if k not in SUPPORTED and k.split(".")[0] not in SUPPORTED]
    return sorted(out)


# What a task's network reads as (Harbor's per-role policy, [environment] network_mode) -> its line
# in the import report. A task with an image gets a network only when its task.toml asks for one
# explicitly (network_mode = "public", or allow_internet = true); Harbor's default (public when
# unset) and an allowlist run without one here. Tasks without an image run in the recipe's sandbox.
NETWORK = {"public": "public (as authored)", "no-network": "no network (as authored)",
           "allowlist": "allowlist: no network here", "default": "unset (Harbor: public): no network here",
           "sandbox": "the recipe's sandbox (no image)"}


def _network(model) -> str:
    env = model.environment
    if "network_mode" not in env.model_fields_set and env.allowed_hosts is None:
        return "default"
    return env.network_mode.value


# ---------------------------------------------------------------------------------------------
# The parts of a task


def _environment(folder: Path, config: dict) -> tuple[dict[str, str], str, str, dict]:
    """(files, setup, workdir, image fields of the Task) from environment/ and [environment]."""
    env = folder / "environment"
    docker = [name for name in DOCKER_FILES if (env / name).is_file()]
    if not (env / "setup.sh").is_file():
        compose = [name for name in docker if name != "Dockerfile"]
        if compose:
            raise Skip(f"needs docker-compose (environment/{compose[0]}: several services are "
                        f"not supported)", "compose")
        image = config.get("docker_image") or ""
        if not isinstance(image, str):
            raise Skip("task.toml: environment.docker_image must be a string", "task.toml")
        if docker or image:
            return _image_task(folder, config, image)
    if not env.is_dir():
        return {}, "", DEFAULT_WORKDIR, {}
    setup = read_text(folder, "environment/setup.sh") if (env / "setup.sh").is_file() else ""
    workdir = DEFAULT_WORKDIR
    if "Dockerfile" in docker:
        workdir = _dockerfile_workdir(read_text(folder, "environment/Dockerfile"))
    files = read_tree(folder, "environment", exclude=NOT_COPIED)
    # setup runs in the workspace, where these files are, before anything of setup.sh
    executable = [rel for rel in executable_files(folder, "environment") if rel in files]
    return files, _chmod(executable) + setup, workdir, {}


def _image_task(folder: Path, config: dict, image: str) -> tuple[dict[str, str], str, str, dict]:
    """A task that runs in a container of its own image: environment/ is the build context."""
    resources = _resources(config)
    if (folder / "environment/Dockerfile").is_file():
        dockerfile = read_text(folder, "environment/Dockerfile")
        kind, problem = images.offline_problem(dockerfile)
        if problem:
            raise Skip(f"environment/Dockerfile: {problem}", kind)
        context = read_tree(folder, "environment")
        executable = executable_files(folder, "environment")
        if executable:  # (COPY keeps modes: tasks hold text, so the modes travel by name)
            context[images.EXECUTABLES] = "".join(f"{rel}\n" for rel in executable)
        return {}, "", _dockerfile_workdir(dockerfile), {"image_files": context, "resources": resources}
    kind, problem = images.offline_problem(f"FROM {image}\n")
    if problem:
        raise Skip(f"task.toml: environment.docker_image: {problem}", kind)
    return {}, "", DEFAULT_WORKDIR, {"image": image, "resources": resources}


def _resources(config: dict) -> dict:
    """[environment] cpus, memory(_mb) and storage(_mb) as Task.resources."""
    out: dict = {}
    cpus = config.get("cpus")
    if cpus is not None:
        if not (type(cpus) in (int, float) and 0 < cpus <= 1024):
            raise Skip(f"task.toml: environment.cpus must be a positive number, not {cpus!r}", "task.toml")
        out["cpus"] = cpus
    for key in ("memory", "storage"):
        value = config.get(f"{key}_mb", config.get(key))
        if value is not None:
            out[f"{key}_mb"] = _megabytes(value, key)
    return out  # (the network: _network, from Harbor's reading of network_mode and allow_internet)


def _megabytes(value, key: str) -> int:
    """MiB from a number (MiB) or a size such as '2G', '512M', '1.5g'; finite, at most MAX_SIZE_MB."""
    mib = None
    if type(value) in (int, float):
        mib = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)i?b?\s*", str(value), re.I)
        if m:
            mib = float(m.group(1)) * {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[m.group(2).lower()]
    if mib is None or not (math.isfinite(mib) and 0 < mib <= MAX_SIZE_MB):  # (inf, nan, 1e400)
        raise Skip(f"task.toml: environment.{key} must be a size such as '2G' or a number of MiB "
                    f"(at most 1T), not {value!r}", "task.toml")
    return max(1, int(mib))


def _dockerfile_workdir(text: str) -> str:
    workdir = DEFAULT_WORKDIR
    try:
        parsed = dockerfile.instructions(text)  # (heredoc bodies are not instructions)
    except dockerfile.Untranslatable as e:
        raise Skip(f"environment/Dockerfile: {e}", "dockerfile") from None
    for ins in parsed:
        arg = ins.args.strip().strip("\"'")
        if ins.keyword == "FROM":
            workdir = DEFAULT_WORKDIR  # every build stage starts from its base image's
        elif ins.keyword == "WORKDIR" and arg:
            if "$" in arg:
                raise Skip(f"environment/Dockerfile: WORKDIR {arg} uses a variable we cannot "
                            f"resolve without Docker", "dockerfile")
            workdir = posixpath.normpath(posixpath.join(workdir, arg))  # relative: to the last
    try:
        check_workdir(workdir)
    except ValueError:
        raise Skip(f"environment/Dockerfile: WORKDIR {workdir} cannot be the sandbox workspace", "dockerfile") from None
    return workdir


def _solution(folder: Path, env: dict[str, str], semantics: str) -> list[str]:
    """The reference solution: solve.sh as one command; with other files in solution/, as in
    Harbor, the folder is unpacked at /solution first and `bash /solution/solve.sh` runs
    (Harbor semantics: the agent is root in its container; the isolated sandbox has no /solution)."""
    if not (folder / "solution/solve.sh").is_file():
        return []  # still importable; prepare-tasks reports that it cannot be validated
    script = read_text(folder, "solution/solve.sh")
    if not script.strip():
        return []
    others = [rel for rel in file_names(folder / "solution") if rel != "solve.sh"]
    used = [rel for rel in others if posixpath.basename(rel) in script]
    if not (used or (others and "/solution" in script)):
        return [_exports(env) + script]
    if semantics != HARBOR:
        raise Skip(f"solution/solve.sh needs other files of solution/ ({', '.join(used or others)}), "
                   f"which only Harbor semantics unpack (at /solution)", "solution-files")
    files = read_tree(folder, "solution")
    archive = bwrap.tar_files(files, 0)
    if len(archive) > SOLUTION_MAX:
        raise Skip(f"solution/ holds {len(archive) / 2**20:.1f} MB (at most {SOLUTION_MAX >> 20} MB: it is "
                   f"sent as a command)", "solution-files")
    body = base64.encodebytes(archive).decode()
    unpack = (f"mkdir -p /solution && base64 -d <<'OBSSPEC_SOLUTION' | tar -x -C /solution\n{body}OBSSPEC_SOLUTION\n"
              f"{_chmod([f'/solution/{rel}' for rel in executable_files(folder, 'solution')])}")
    return [unpack + _exports(env) + "bash /solution/solve.sh"]


def _verify_script(workdir: str, env: dict[str, str], executable: list[str]) -> str:
    chmod = _chmod([f"/tests/{rel}" for rel in executable])
    return (f"{_exports(env)}{chmod}cd {shlex.quote(workdir)} || exit 1\nbash /tests/test.sh\n"
            f"status=$?\n{REWARD_JSON_TO_TXT}exit $status\n")


def _chmod(paths: list[str]) -> str:
    return f"chmod +x -- {' '.join(shlex.quote(p) for p in paths)}\n" if paths else ""


def _env(config: dict, section: str) -> dict[str, str]:
    env = _table(config, section).get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise Skip(f"task.toml: {section}.env must be a table of strings", "task.toml")
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise Skip(f"task.toml: {section}.env has an invalid variable name {key!r}", "task.toml")
        if "${" in value:  # Harbor fills these from the host (API keys): nothing to fill them with
            raise Skip(f"task.toml: {section}.env.{key} needs a host variable ({value})", "host-variables")
    return env


def _exports(env: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))


def _table(config: dict, key: str) -> dict:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise Skip(f"task.toml: [{key}] must be a table", "task.toml")
    return value


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
