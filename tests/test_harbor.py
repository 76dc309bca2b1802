"""Harbor import: the example task folders, every skip reason, and each valid task run for real.

The end-to-end tests run each imported task in the bubblewrap sandbox twice: with its reference
solution (reward 1.0) and without it (reward below 1.0), so a mapping mistake (wrong workdir,
files, setup or reward handling) shows up as a wrong reward.
"""

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from obsspec.env.episode import verify_task
from obsspec.env.harbor import HarborImportError, import_harbor
from obsspec.env.sandbox import Sandbox, SandboxConfig
from obsspec.env.task import Task

FIXTURES = Path(__file__).parent / "fixtures"
# the valid examples ship with the project (tasks/); the malformed ones are test fixtures
GOOD = Path(__file__).parent.parent / "tasks" / "harbor-examples"
BAD = FIXTURES / "harbor_bad"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
FAST = SandboxConfig(timeout_s=10, memory_mb=1024, max_procs=64)


def tasks_by_id(path=GOOD):
    return {t.task_id: t for t in import_harbor(path).tasks}


def make_task(root: Path, name: str, **files: str) -> Path:
    """A minimal valid Harbor task folder; `files` (path with '__' for '/') add or replace files."""
    folder = root / name
    base = {"task.toml": "[metadata]\ncategory = 'demo'\n", "instruction.md": "Do it.\n",
            "tests/test.sh": "test -f /app/done\n"}
    for rel, text in {**base, **{k.replace("__", "/"): v for k, v in files.items()}}.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


# ---------------------------------------------------------------------------------------------
# importing


def test_valid_fixtures_import_in_name_order_with_nothing_skipped():
    report = import_harbor(GOOD)
    assert report.skipped == [] and report.counts() == {}
    names = ["clock-wait", "count-words", "entrypoint-service", "hello-file", "heredoc-inventory",
             "home-config", "root-admin", "stale-reports", "sum-scores", "web-service"]
    assert [t.task_id for t in report.tasks] == [f"harbor-{n}" for n in names]
    # [verifier] timeout_sec is the verifier's time limit
    timeouts = {"harbor-count-words": 120.0, "harbor-sum-scores": 30.0}
    assert {t.task_id: t.verify_timeout_s for t in report.tasks} == {
        t.task_id: timeouts.get(t.task_id, 60.0) for t in report.tasks}


def test_task_toml_is_read_by_harbors_model_and_fields_run_without_are_counted_by_field(tmp_path):
    """Harbor's TaskConfig reads task.toml: its defaults (a 600 s verifier), its migrations
    (allow_internet -> network_mode), [environment] workdir over the image's WORKDIR; every field
    a task sets that obsspec does not honour is counted by field, and the task still imports."""
    image = "FROM debian:12\nWORKDIR /srv\n"
    make_task(tmp_path, "a", **{"environment__Dockerfile": image, "task.toml": (
        "[agent]\ntimeout_sec = 300\nuser = 'agent'\n[environment]\nworkdir = '/work/x'\nnetwork_mode = 'public'\n"
        "env = { A = 'b' }\n[environment.healthcheck]\ncommand = 'true'\n")})
    make_task(tmp_path, "b", **{"environment__Dockerfile": image, "task.toml": (
        "[agent]\ntimeout_sec = 60\n[environment]\nallow_internet = false\n")})
    make_task(tmp_path, "c", **{"environment__Dockerfile": image, "task.toml": (
        "[verifier]\nnetwork_mode = 'no-network'\n[environment]\nnetwork_mode = 'allowlist'\n"
        "allowed_hosts = ['pypi.org']\n")})
    make_task(tmp_path, "d", **{"environment__Dockerfile": image})
    make_task(tmp_path, "e")
    report = import_harbor(tmp_path)
    assert report.skipped == [], report.skipped
    t = {task.task_id: task for task in report.tasks}
    assert t["harbor-a"].workdir == "/work/x" and t["harbor-b"].workdir == "/srv"
    assert t["harbor-d"].verify_timeout_s == 600.0, "Harbor's default verifier timeout"
    assert t["harbor-a"].resources.get("internet") is True
    assert not any(t[k].resources.get("internet") for k in ("harbor-b", "harbor-c", "harbor-d"))
    assert dict(report.unsupported) == {"agent.timeout_sec": 2, "agent.user": 1, "environment.env": 1,
                                        "environment.healthcheck": 1, "environment.allowed_hosts": 1,
                                        "verifier.network_mode": 1}
    assert dict(report.network) == {"public (as authored)": 1, "no network (as authored)": 1,
                                    "allowlist: no network here": 1, "unset (Harbor: public): no network here": 1,
                                    "the recipe's sandbox (no image)": 1}


def test_imported_tasks_run_as_harbor_runs_them_unless_asked_otherwise():
    """Harbor semantics are the default of an import (a property of each task, in the suite);
    `isolated` gives the built-in families' sandbox, written as the default '' (no new key)."""
    assert {t.semantics for t in import_harbor(GOOD).tasks} == {"harbor"}
    isolated = import_harbor(GOOD, semantics="isolated").tasks
    assert {t.semantics for t in isolated} == {""} and "semantics" not in isolated[0].to_dict()
    assert all(t.harbor and Task.from_dict(t.to_dict()) == t for t in import_harbor(GOOD).tasks)
    with pytest.raises(ValueError, match="semantics must be one of isolated, harbor"):
        import_harbor(GOOD, semantics="docker")


def test_task_without_environment_maps_every_field():
    task = tasks_by_id()["harbor-hello-file"]
    folder = GOOD / "hello-file"
    assert task.family == "harbor:file-operations"
    assert task.instruction == (folder / "instruction.md").read_text().strip()
    assert task.files == {} and task.setup == "" and task.workdir == "/app"
    assert task.solution == [(folder / "solution/solve.sh").read_text()]
    assert task.verify_files == {"test.sh": (folder / "tests/test.sh").read_text(),
                                 "expected_hello.txt": "Hello, Harbor!\n"}
    assert "bash /tests/test.sh" in task.verify
    assert task.source == f"harbor:{folder.resolve()}" and task.max_turns == 12


def test_setup_sh_files_and_dockerfile_workdir():
    task = tasks_by_id()["harbor-count-words"]
    env = GOOD / "count-words/environment"
    assert task.setup == (env / "setup.sh").read_text()
    # Dockerfile and setup.sh stay out of the workspace; the last (relative) WORKDIR wins
    assert task.files == {"data.txt": (env / "data.txt").read_text()}
    assert task.workdir == "/srv/work"
    assert task.verify.startswith("cd /srv/work")


def test_category_is_sanitised_and_verifier_env_exported():
    task = tasks_by_id()["harbor-sum-scores"]
    assert task.family == "harbor:data-processing"
    assert task.verify.startswith("export SCORES_FILE=/tests/scores.csv\n")
    assert "reward.json" in task.verify


def test_task_round_trips_through_dict():
    for task in import_harbor(GOOD).tasks:
        assert type(task).from_dict(task.to_dict()) == task


def test_single_task_folder_form():
    report = import_harbor(GOOD / "hello-file")
    assert [t.task_id for t in report.tasks] == ["harbor-hello-file"] and report.skipped == []


EXPECTED_SKIPS = {
    "broken-toml": "invalid task.toml: Invalid value (at line 3, column 14)",
    "dockerfile-only": "environment/Dockerfile: base image ubuntu:24.04 is not here and could not be pulled",
    "empty-instruction": "instruction.md is empty",
    "missing-task-toml": "missing task.toml",
    "missing-test-sh": "missing tests/test.sh",
    "symlink-escape": "tests/users.txt is a symlink pointing outside the task folder",
}


def test_malformed_fixtures_are_skipped_with_one_line_reasons():
    report = import_harbor(BAD)
    assert [t.task_id for t in report.tasks] == ["harbor-solution-needs-files"]  # (Harbor unpacks solution/)
    report = import_harbor(BAD, semantics="isolated")
    skip = next(s for s in report.skipped if s[0] == "solution-needs-files")
    assert skip[1] == ("solution/solve.sh needs other files of solution/ (fix.diff), which only Harbor "
                       "semantics unpack (at /solution)")
    report.skipped.remove(skip)
    report.kinds.pop("solution-needs-files")
    assert report.tasks == []
    reasons = dict(report.skipped)
    assert sorted(reasons) == sorted(EXPECTED_SKIPS)
    for name, expected in EXPECTED_SKIPS.items():
        assert reasons[name].startswith(expected), f"{name}: {reasons[name]}"
        assert "\n" not in reasons[name]
    # the report counts what each class of reason cost, largest first
    assert report.counts() == {"layout": 3, "files": 1, "task.toml": 1, "base-image": 1}
    assert list(report.counts().values()) == sorted(report.counts().values(), reverse=True)


def test_a_bad_single_task_folder_is_skipped_not_raised():
    report = import_harbor(BAD / "missing-task-toml")
    assert report.tasks == [] and report.skipped[0][0] == "missing-task-toml"


@pytest.mark.parametrize("files, reason", [
    ({"task.toml": "[environment]\ndocker_image = 'org/img:1'\n"},
     "task.toml: environment.docker_image: base image org/img:1 is not here and could not be pulled"),
    ({"environment__docker-compose.yaml": "services: {}\n"},
     "needs docker-compose (environment/docker-compose.yaml: several services"),
    ({"task.toml": "[environment]\ndocker_image = 'debian:12'\nmemory = 'lots'\n"},
     "task.toml: environment.memory must be a size"),
    ({"environment__setup.sh": ":", "environment__Dockerfile": "FROM x\nWORKDIR $HOME\n"},
     "environment/Dockerfile: WORKDIR $HOME uses a variable"),
    ({"environment__setup.sh": ":", "environment__Dockerfile": "FROM x\nWORKDIR /usr/src/app\n"},
     "environment/Dockerfile: WORKDIR /usr/src/app cannot be the sandbox workspace"),
    ({"environment__setup.sh": ":", "environment__Dockerfile": "FROM x\nWORKDIR /tmp\n"},
     "environment/Dockerfile: WORKDIR /tmp cannot be the sandbox workspace"),  # hung prepare-tasks
    ({"environment__setup.sh": ":", "environment__Dockerfile": "FROM x\nWORKDIR /run/app\n"},
     "environment/Dockerfile: WORKDIR /run/app cannot be the sandbox workspace"),
    # Harbor's own task model reads task.toml: its message, with the field's path
    ({"task.toml": "[verifier]\ntimeout_sec = 'soon'\n"}, "task.toml: verifier.timeout_sec: Input should be a valid number"),
    ({"task.toml": "metadata = 3\n"}, "task.toml: metadata: Input should be a valid dictionary"),
    ({"task.toml": "[[steps]]\nname = 'a'\n[[steps]]\nname = 'b'\n"}, "task.toml: a multi-step trial (2 [[steps]])"),
    ({"task.toml": "[environment]\ngpus = 1\n"}, "task.toml: the task needs GPUs"),
    ({"task.toml": "[environment]\nworkdir = '/proc/x'\n"}, "task.toml: environment.workdir /proc/x cannot be"),
    ({"task.toml": "[verifier]\nenv = { KEY = '${OPENAI_API_KEY}' }\n"},
     "task.toml: verifier.env.KEY needs a host variable"),
])
def test_other_skip_reasons(tmp_path, files, reason):
    make_task(tmp_path, "t", **files)
    report = import_harbor(tmp_path)
    assert report.tasks == [] and report.skipped[0][1].startswith(reason), report.skipped
    assert report.kinds["t"] in ("files", "task.toml", "base-image", "compose", "dockerfile", "host-variables",
                                 "multi-step", "os", "accelerators")


def test_dockerfile_heredocs_import_and_one_we_cannot_translate_is_a_counted_skip(tmp_path):
    """Heredocs are translated at build time (obsspec/env/dockerfile.py), so they import; a COPY
    heredoc that BuildKit would expand with build arguments is skipped, in the 'dockerfile' class,
    and a heredoc body that reads like an instruction is not one (its WORKDIR is not the task's)."""
    body = "RUN cat <<'EOF' > /etc/motd\nWORKDIR /nowhere\nFROM elsewhere:1\nEOF\n"
    make_task(tmp_path, "ok", environment__Dockerfile=f"FROM debian:bookworm\nWORKDIR /srv/app\n{body}")
    make_task(tmp_path, "vars", environment__Dockerfile="FROM debian:bookworm\nCOPY <<EOF /x\n$HOME\nEOF\n")
    report = import_harbor(tmp_path)
    assert [t.workdir for t in report.tasks] == ["/srv/app"]
    assert report.kinds == {"vars": "dockerfile"} and "BuildKit's build-time expansion" in report.skipped[0][1]


def test_non_utf8_file_is_skipped(tmp_path):
    (make_task(tmp_path, "t") / "instruction.md").write_bytes(b"caf\xe9\n")
    assert import_harbor(tmp_path).skipped == [("t", "instruction.md is not UTF-8 text (byte 3)")]


def test_fifos_devices_and_odd_names_are_skipped_and_links_count_their_size(tmp_path):
    """A FIFO hung the import, a device node was read until memory
    ran out, 30 links to one 4.4 MB file made a 141 MB suite, a non-UTF-8 name crashed the write."""
    import os

    os.mkfifo(make_task(tmp_path / "a", "fifo") / "tests" / "pipe")
    assert import_harbor(tmp_path / "a").skipped == [("fifo", "tests/pipe is not a regular file (a FIFO, socket or device)")]
    folder = make_task(tmp_path / "b", "links")
    (folder / "environment").mkdir()
    with open(folder / "environment" / "big", "wb") as f:
        f.truncate(100 << 20)  # (sparse: the sizes are stat's, nothing is read)
    for i in range(3):
        (folder / f"environment/link{i}").symlink_to("big")
    assert import_harbor(tmp_path / "b").skipped[0][1].startswith("files too large (400.0 MB > 256 MB")
    folder = make_task(tmp_path / "c", "name")
    (folder / os.fsdecode(b"tests/caf\xe9.txt")).write_text("x")
    assert "a file name that is not UTF-8" in import_harbor(tmp_path / "c").skipped[0][1]


def test_symlinks_inside_the_folder_are_followed(tmp_path):
    folder = make_task(tmp_path, "t", tests__expected="42\n")
    (folder / "tests/copy").symlink_to("expected")
    assert import_harbor(tmp_path).tasks[0].verify_files["copy"] == "42\n"


def test_missing_solution_imports_with_empty_solution(tmp_path):
    make_task(tmp_path, "t")
    assert import_harbor(tmp_path).tasks[0].solution == []


def test_names_that_sanitise_alike_keep_the_first(tmp_path):
    make_task(tmp_path, "My_Task")
    make_task(tmp_path, "my-task")
    report = import_harbor(tmp_path)
    assert [t.task_id for t in report.tasks] == ["harbor-my-task"]
    assert report.skipped == [("my-task", "task id 'harbor-my-task' is already taken by My_Task")]


def test_path_errors_are_clear_value_errors(tmp_path):
    with pytest.raises(HarborImportError, match="no such directory"):
        import_harbor(tmp_path / "nope")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("hi\n")
    with pytest.raises(HarborImportError, match="no Harbor task folders"):
        import_harbor(tmp_path)
    assert issubclass(HarborImportError, ValueError)


# ---------------------------------------------------------------------------------------------
# end to end, in the real sandbox


async def episode(task, commands):
    """Start the task's sandbox, run `commands`, return (their exit codes, the reward)."""
    async with Sandbox(FAST, workdir=task.workdir) as sandbox:
        await sandbox.start(files=task.files, setup=task.setup)
        codes = [(await sandbox.run(c)).exit_code for c in commands]
        return codes, await verify_task(sandbox, task)


@needs_bwrap
@pytest.mark.parametrize("task_id",
                         ["harbor-count-words", "harbor-hello-file", "harbor-sum-scores"])
def test_solution_passes_and_doing_nothing_fails(task_id):
    task = tasks_by_id()[task_id]
    codes, reward = asyncio.run(episode(task, task.solution))
    assert codes == [0] and reward == 1.0, f"{task_id}: the reference solution must score 1.0"
    _, reward = asyncio.run(episode(task, []))
    assert reward < 1.0, f"{task_id}: doing nothing must not score 1.0"


@needs_bwrap
def test_reward_json_partial_credit_reaches_the_sandbox():
    """(and the grader's expected sum is its own: it read /app/scores.csv, so a rewritten input
    and a matching answer scored 1)"""
    task = tasks_by_id()["harbor-sum-scores"]
    assert asyncio.run(episode(task, ["echo 7 > sum.txt"]))[1] == 0.5
    assert asyncio.run(episode(task, []))[1] == 0.0
    assert asyncio.run(episode(task, ["printf 'name,score\\n' > scores.csv; echo 0 > sum.txt"]))[1] == 0.5


def test_prepare_tasks_drops_or_flags_what_a_cheap_cheat_passes(tmp_path):
    """The audit (obsspec/env/audit.py) on sum-scores as it shipped (its grader read the
    agent's /app/scores.csv): placeholder answers (`0` in every file its tests name) pass it.
    Dropped by default, kept and named with `cheat_audit: flag`; the fixed task passes none.
    A task whose deliverable is a program (its output checked against a fixed value) passes
    `failed-run` honestly: the reference writes the same program whatever the inputs held. That
    is flagged, never dropped."""
    from obsspec.env.audit import cheat_commands
    from obsspec.env.suite import TasksConfig, prepare_tasks
    from obsspec.progress import NullDisplay

    src = tmp_path / "src"
    shutil.copytree(GOOD / "sum-scores", src / "sum-scores")
    shutil.copytree(GOOD / "sum-scores", src / "old-sum-scores")
    toml = src / "old-sum-scores" / "task.toml"
    toml.write_text(toml.read_text().replace("/tests/scores.csv", "/app/scores.csv"))
    make_task(src, "count-program", **{
        "instruction.md": "Write /app/count.sh, a script that prints how many lines /app/data.txt has.\n",
        "environment__data.txt": "a\nb\nc\n",
        "solution__solve.sh": "printf '#!/bin/bash\\nwc -l < /app/data.txt\\n' > /app/count.sh\n",
        "tests__test.sh": "[ \"$(bash /app/count.sh)\" = 3 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"})
    assert sorted(cheat_commands(import_harbor(src).tasks[1])) == ["delete-inputs", "empty-inputs", "failed-run", "placeholder"]
    for mode in ("drop", "flag"):
        cfg = TasksConfig(builtin=False, harbor_dir=str(src), harbor_semantics="isolated", val_fraction=0.0,
                          determinism_check=False, workers=2, cheat_audit=mode)
        summary = asyncio.run(prepare_tasks(cfg, FAST, str(tmp_path / mode), NullDisplay()))
        manifest = json.loads((tmp_path / mode / "manifest.json").read_text())
        dropped = 1 if mode == "drop" else 0
        assert manifest["cheats"] == {"audited": 3, "passed_by_a_cheat": 2, "dropped": dropped, "flagged": 2 - dropped,
                                      "by_check": {"failed-run": 1, "placeholder": 1},
                                      "tasks": {"harbor-count-program": ["failed-run"],
                                                "harbor-old-sum-scores": ["placeholder"]}}, manifest["cheats"]
        assert summary["cheat_passes_share"] == round(2 / 3, 3)
        assert summary["train"] == 3 - dropped
    assert manifest["reasons"] == {}  # (flagged, not dropped)


# ---------------------------------------------------------------------------------------------
# what Docker would have kept: the verifier's time limit and executable files


@needs_bwrap
def test_the_verifiers_timeout_sec_is_its_time_limit(tmp_path):
    # FAST gives a verifier 4 x 10 s by default: a 2 s limit cuts a 5 s test, a 60 s one does not
    slow = "sleep 5; test -f /app/done\n"
    short = import_harbor(make_task(tmp_path, "short", **{"task.toml": "[verifier]\ntimeout_sec = 2\n",
                                    "tests/test.sh": slow})).tasks[0]
    assert short.verify_timeout_s == 2.0
    assert asyncio.run(episode(short, ["touch done"]))[1] == 0.0, "a 2 s verifier ran past its limit"
    quick = import_harbor(make_task(tmp_path, "quick", **{"task.toml": "[verifier]\ntimeout_sec = 60\n",
                                    "tests/test.sh": "sleep 1; test -f /app/done\n"})).tasks[0]
    assert asyncio.run(episode(quick, ["touch done"]))[1] == 1.0


@needs_bwrap
def test_a_verifier_may_run_longer_than_the_sandboxs_default(tmp_path):
    tight = SandboxConfig(timeout_s=1, memory_mb=1024, max_procs=64)  # default limit: 4 s
    task = import_harbor(make_task(tmp_path, "long", **{"task.toml": "[verifier]\ntimeout_sec = 30\n",
                                   "tests/test.sh": "sleep 6; test -f /app/done\n"})).tasks[0]

    async def run():
        async with Sandbox(tight, workdir=task.workdir) as sandbox:
            await sandbox.start(files=task.files, setup=task.setup)
            await sandbox.run("touch done")
            return await verify_task(sandbox, task)

    assert asyncio.run(run()) == 1.0, "the task's timeout_sec was not applied (the 4 s default cut it)"


@needs_bwrap
def test_executable_files_stay_executable(tmp_path):
    folder = make_task(tmp_path, "modes", **{
        "tests/test.sh": "/tests/check.sh\n", "tests/check.sh": "#!/bin/bash\ntest \"$(cat /app/out)\" = ran\n",
        "environment/setup.sh": "", "environment/bin/run.sh": "#!/bin/bash\necho ran\n",
        "environment/notes.txt": "plain\n"})
    (folder / "tests/check.sh").chmod(0o755)
    (folder / "environment/bin/run.sh").chmod(0o755)
    task = import_harbor(folder).tasks[0]
    codes, reward = asyncio.run(episode(task, ["./bin/run.sh > out", "test -x notes.txt"]))
    assert codes == [0, 1], "bin/run.sh must be executable in the workspace, notes.txt not"
    assert reward == 1.0, "test.sh could not execute /tests/check.sh directly"
    plain = import_harbor(make_task(tmp_path, "plain")).tasks[0]
    assert "chmod" not in plain.verify and plain.setup == "", "nothing executable, nothing added"


def test_a_suite_line_with_unknown_semantics_is_one_clear_error(tmp_path):
    import json

    from obsspec.env.suite import SuiteError, load_tasks

    line = {**tasks_by_id()["harbor-hello-file"].to_dict(), "semantics": "root"}
    (tmp_path / "train.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(SuiteError, match="train.jsonl:1: not a task: semantics must be one of isolated, harbor"):
        load_tasks(str(tmp_path))


def test_a_missing_base_is_asked_for_once_however_many_tasks_use_it(tmp_path, monkeypatch):
    """Importing thousands of tasks on one base that cannot be had: one look and one pull."""
    from obsspec.env import images

    calls = []
    monkeypatch.setattr(images, "_pulls", {})
    monkeypatch.setattr(images, "image_exists", lambda name: calls.append(("exists", name)) or False)
    monkeypatch.setattr(images.shutil, "which", lambda name: f"/usr/bin/{name}")

    class Done:
        returncode, stdout = 125, "Error: no registry\n"

    monkeypatch.setattr(images, "podman", lambda *args, **kw: calls.append(args[:1]) or Done())
    for i in range(5):
        make_task(tmp_path, f"t{i}", environment__Dockerfile="FROM org/base:1\n")
    report = import_harbor(tmp_path)
    assert report.counts() == {"base-image": 5}
    assert calls == [("exists", "org/base:1"), ("pull",)], calls


HOSTILE = FIXTURES / "harbor_hostile"  # (deep, huge and oddly named folders are made below)
HOSTILE_SKIPS = {
    "inf-memory": ("task.toml", "task.toml: environment.memory must be a size"),
    "huge-storage": ("task.toml", "task.toml: environment.storage must be a size"),
    "nan-cpus": ("task.toml", "task.toml: environment.cpus must be a positive number"),
    "symlink-loop": ("files", "tests/loop is a symlink to a directory or to nothing"),
    "dir-link": ("files", "tests/up is a symlink to a directory or to nothing"),
    "deep": ("files", "directories nested more than 32 deep"),
    "wide": ("files", "more than 5000 files and directories"),
    "huge": ("files", "files too large (1048576.0 MB > 256 MB total)"),
    "escape-name": ("files", r"'tests/\x1b[2Jreward 1': a file name with a control character"),
    "newline-name": ("files", r"'tests/a\nb': a file name with a control character"),
}


def test_hostile_folders_are_one_line_skips_counted_by_kind_and_the_rest_import(tmp_path):
    """`memory = inf` and `storage_mb = 1e400` raised OverflowError and a folder 1,100 deep
    RecursionError, losing every other task of the import with them."""
    shutil.copytree(HOSTILE, tmp_path, symlinks=True, dirs_exist_ok=True)
    deep = make_task(tmp_path, "deep") / "environment"
    deep.mkdir()
    _nest(deep, 1100)
    try:
        _check_hostile(tmp_path)
    finally:
        _nest(deep, 0)  # (pytest's own clean-up of old tmp dirs recurses too)


def _nest(path: Path, levels: int) -> None:
    """Make `levels` directories `d/d/...` under `path` (past PATH_MAX: one at a time from
    inside), or remove them all (levels=0)."""
    here = os.getcwd()
    os.chdir(path)
    try:
        if levels:
            for _ in range(levels):
                os.mkdir("d")
                os.chdir("d")
        else:
            depth = 0
            while os.path.isdir("d"):
                os.chdir("d")
                depth += 1
            for _ in range(depth):
                os.chdir("..")
                os.rmdir("d")
    finally:
        os.chdir(here)


def _check_hostile(tmp_path: Path) -> None:
    wide = make_task(tmp_path, "wide", environment__data="x") / "environment"
    for i in range(5_000):
        os.close(os.open(wide / str(i), os.O_CREAT | os.O_WRONLY))
    with open(make_task(tmp_path, "huge", environment__data="x") / "environment" / "sparse", "wb") as f:
        f.truncate(1 << 40)  # a sparse terabyte: stat only, never read
    (make_task(tmp_path, "escape-name") / "tests" / "\x1b[2Jreward 1").write_text("x")
    (make_task(tmp_path, "newline-name") / "tests" / "a\nb").write_text("x")
    report = import_harbor(tmp_path)
    assert [t.task_id for t in report.tasks] == ["harbor-good"]
    reasons = dict(report.skipped)
    assert sorted(reasons) == sorted(HOSTILE_SKIPS)
    for name, (kind, reason) in HOSTILE_SKIPS.items():
        assert reasons[name].startswith(reason) and report.kinds[name] == kind, (name, reasons[name])
        assert reasons[name].isprintable(), name
    assert report.counts() == {"files": 7, "task.toml": 3}


def test_an_unforeseen_error_in_one_folder_is_a_counted_skip(tmp_path, monkeypatch):
    from obsspec.env import harbor

    make_task(tmp_path, "a")
    make_task(tmp_path, "b")

    def broken(folder, env, semantics):
        if folder.name == "a":
            raise OverflowError("cannot convert float infinity\nto integer")
        return []

    monkeypatch.setattr(harbor, "_solution", broken)
    report = import_harbor(tmp_path)
    assert [t.task_id for t in report.tasks] == ["harbor-b"]
    assert report.skipped == [("a", r"cannot import: OverflowError: cannot convert float infinity\nto integer")]
    assert report.counts() == {"unreadable": 1}


@needs_bwrap
def test_the_audit_names_a_verifier_that_runs_the_agents_venv(tmp_path):
    """A test.sh that activates the workdir's .venv runs whatever python3 the agent put there:
    the `venv-shims` cheat passes it; the same check run by the system's python3 passes none."""
    from obsspec.env.audit import audit

    check = "tests__check.py"
    src = "import sys\nsys.exit(0 if open('/app/answer.txt').read() == '42\\n' else 1)\n"
    make_task(tmp_path, "venv", **{check: src,
              "tests__test.sh": "cd /app && . .venv/bin/activate 2>/dev/null; python3 /tests/check.py\n"})
    make_task(tmp_path, "plain", **{check: src, "tests__test.sh": "python3 /tests/check.py\n"})
    tasks = {t.task_id: t for t in import_harbor(tmp_path, semantics="isolated").tasks}
    assert asyncio.run(audit(tasks["harbor-venv"], FAST)) == ["venv-shims"]
    assert asyncio.run(audit(tasks["harbor-plain"], FAST)) == []


# ---------------------------------------------------------------------------------------------
# a task is its folder: binary and large files


def binary_task(root: Path, name: str = "t", **files) -> tuple[Path, dict[str, bytes]]:
    """A task folder with a binary image and a 6 MB file in environment/ (the workspace), a binary
    expected answer in tests/, and a small text file; returns the folder and the binary contents."""
    logo = b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)) * 8
    big = bytes((i * 7919) % 251 for i in range(6 << 20))  # over the 5 MB that once skipped a task
    folder = make_task(root, name, **{"environment__notes": "small text\n",
                                      "tests__test.sh": "cmp /app/out.png /tests/expected.png\n", **files})
    (folder / "environment" / "logo.png").write_bytes(logo)
    (folder / "environment" / "big.bin").write_bytes(big)
    (folder / "tests" / "expected.png").write_bytes(logo)
    return folder, {"logo.png": logo, "big.bin": big}


def test_a_task_is_its_folder_binary_and_large_files_are_blobs_kept_by_their_hash(tmp_path):
    import hashlib

    from obsspec.env.suite import SuiteError, load_tasks, write_blobs
    from obsspec.env.task import Blob

    _, data = binary_task(tmp_path / "src")
    task = import_harbor(tmp_path / "src").tasks[0]
    assert task.files["notes"] == "small text\n", "small text stays text"
    for name in ("logo.png", "big.bin"):
        blob = task.files[name]
        assert isinstance(blob, Blob) and blob.sha256 == hashlib.sha256(data[name]).hexdigest()
        assert blob.size == len(data[name]) and blob.read() == data[name]
    assert isinstance(task.verify_files["expected.png"], Blob)
    # the suite line names the blobs by hash; their bytes go to blobs/, and come back from there
    line = json.dumps(task.to_dict())
    assert len(line) < 2000 and '"sha256"' in line
    write_blobs(str(tmp_path / "suite"), [task])
    (tmp_path / "suite" / "train.jsonl").write_text(line + "\n")
    loaded = load_tasks(str(tmp_path / "suite"))[0]
    assert loaded == task.with_blobs_in(str(tmp_path / "suite" / "blobs")) and loaded.content_hash() == task.content_hash()
    assert loaded.files["big.bin"].read() == data["big.bin"]
    # content-hashed: one byte changes the task's hash; a blob changed on disk is refused
    other, _ = binary_task(tmp_path / "src2")
    with open(other / "environment" / "big.bin", "r+b") as f:
        f.write(b"\x01")
    assert import_harbor(tmp_path / "src2").tasks[0].content_hash() != task.content_hash()
    with open(loaded.files["big.bin"].path, "r+b") as f:
        f.write(b"\x01")
    with pytest.raises(ValueError, match="changed since the suite was prepared"):
        loaded.files["big.bin"].read()
    os.remove(loaded.files["logo.png"].path)
    with pytest.raises(SuiteError, match="names files missing from .*blobs"):
        load_tasks(str(tmp_path / "suite"))


def test_a_solve_sh_with_helpers_gets_solution_unpacked_at_slash_solution(tmp_path):
    folder = make_task(tmp_path, "t", **{"solution__solve.sh": "bash /solution/helper.sh\n",
                                         "solution__helper.sh": "#!/bin/bash\ncp logo.png out.png\n"})
    os.chmod(folder / "solution" / "helper.sh", 0o755)
    (folder / "solution" / "data.bin").write_bytes(b"\x00\xff" * 10)
    [command] = import_harbor(tmp_path).tasks[0].solution
    assert command.startswith("mkdir -p /solution && base64 -d <<'OBSSPEC_SOLUTION' | tar -x -C /solution\n")
    assert "chmod +x -- /solution/helper.sh\n" in command and command.endswith("bash /solution/solve.sh")


@needs_bwrap
def test_binary_files_reach_the_workspace_and_the_verifier_byte_for_byte(tmp_path):
    _, data = binary_task(tmp_path)
    task = import_harbor(tmp_path, semantics="isolated").tasks[0]
    codes, reward = asyncio.run(episode(task, ["sha256sum logo.png big.bin", "cp logo.png out.png"]))
    assert codes == [0, 0] and reward == 1.0
    _, reward = asyncio.run(episode(task, []))
    assert reward == 0.0
