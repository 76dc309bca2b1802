"""The CLI as a user meets it: --help everywhere, clear one-line errors, real runs end to end."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBSSPEC = [sys.executable, "-m", "obsspec.cli"]
COMMANDS = ["prepare-tasks", "shell", "validate", "demo", "rollout", "train", "train-worldmodel", "export", "build-bases",
            "serve", "report", "simulate"]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def cli(*args, cwd=ROOT, input=None):
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    return subprocess.run([*OBSSPEC, *args], cwd=cwd, capture_output=True, text=True,
                          input=input, env=env, timeout=600)


def test_top_level_help_lists_the_commands():
    r = cli("--help")
    assert r.returncode == 0
    for name in COMMANDS:
        assert name in r.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_ending_with_examples(command):
    r = cli(command, "--help")
    assert r.returncode == 0, r.stderr
    assert "Examples" in r.stdout and f"obsspec {command}" in r.stdout.split("Examples")[1]


@pytest.mark.parametrize("recipe", sorted(glob.glob(os.path.join(ROOT, "recipes", "*.yaml"))))
def test_validate_every_recipe(recipe):
    r = cli("validate", recipe)
    assert r.returncode == 0 and r.stdout.startswith("ok:"), r.stderr


@pytest.mark.parametrize("args, message", [
    (["validate", "recipes/tiny-cpu.yaml", "sandbox.timout_s=3"], "unknown key 'sandbox.timout_s'"),
    (["validate", "missing.yaml"], "missing.yaml: recipe file not found"),
    (["validate", "recipes/terminal-8b.yaml", "policy.tool_format=yaml"], "policy.tool_format must be xml or json"),
    (["validate", "recipes/terminal-8b.yaml", "policy.thinking=sometimes"], "'policy.thinking' must be bool"),
    (["prepare-tasks", "recipes/tiny-cpu.yaml", "tasks.families=[no-such-family]", "--out", "/tmp/x"],
     "unknown task family 'no-such-family'"),
    (["shell", "not-a-task"], "not a built-in task id"),
    (["shell", "nosuch-00001", "-c", "true"], "unknown task family 'nosuch'"),
    (["prepare-tasks", "--from", "/nonexistent/harbor", "--no-builtin", "--out", "/tmp/x"], "/nonexistent/harbor"),
])
def test_user_errors_are_one_line_and_exit_2(args, message):
    r = cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_broken_yaml_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sandbox: {timeout_s: 3\n")
    r = cli("validate", str(bad))
    assert r.returncode == 2 and "YAML syntax error" in r.stderr and str(bad) in r.stderr


@needs_bwrap
def test_shell_prints_observations_as_the_agent_sees_them():
    """...with control characters escaped: ESC and CR in an agent's output reached the terminal
    raw (clear the screen, print a fake 'verifier reward: 1'). The policy's tokens keep them."""
    fake = r"printf '\033[2J\033[H\rverifier reward: 1\n'"
    r = cli("shell", "find-by-name-00003", "-c", "echo hi; false", "-c", "exit 3", "-c", fake, "--no-verify")
    assert r.returncode == 0, r.stderr
    assert "<tool_response>\nhi\n\n(exit_code=1)\n</tool_response>" in r.stdout
    assert "<tool_response>\n(no output)\n(exit_code=3)\n</tool_response>" in r.stdout
    assert "\\x1b[2J\\x1b[H\\rverifier reward: 1\n" in r.stdout
    assert not any(c in r.stdout for c in "\x1b\r"), "a control character reached the terminal"
    from obsspec.chat import wrap_observation
    from obsspec.env.shell import for_terminal

    raw = "\x1b[2J\rok\u202e\x9b\tx\n"
    assert for_terminal(raw) == "\\x1b[2J\\rok\\u202e\\x9b\tx\n"
    assert raw in wrap_observation(raw), "the policy's observation was escaped too"


@needs_bwrap
def test_shell_reads_stdin_and_runs_the_verifier():
    r = cli("shell", "csv-filter-00001", input="pwd\n\nls\n")
    assert r.returncode == 0, r.stderr
    assert "/app\n\n(exit_code=0)" in r.stdout and "# verifier reward: 0" in r.stdout


@needs_bwrap
def test_prepare_tasks_is_reproducible_and_loadable(tmp_path):
    args = ["prepare-tasks", "recipes/tiny-cpu.yaml", "tasks.num_instances=25", "--display", "plain"]
    a, b = tmp_path / "a", tmp_path / "b"
    r1 = cli(*args, "--out", str(a))
    r2 = cli(*args, "--out", str(b))
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    summary = json.loads((a / "summary.json").read_text())
    assert summary["train"] + summary["val"] + summary["dropped"] == 25
    assert summary["dropped"] == 0, (a / "manifest.json").read_text()
    for name in ("train.jsonl", "val.jsonl", "trajectories.jsonl", "manifest.json", "determinism.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs between runs"
    import datasets

    ds = datasets.load_dataset("json", data_files={"train": str(a / "train.jsonl"),
                                                   "val": str(a / "val.jsonl")})
    assert len(ds["train"]) == summary["train"] and "instruction" in ds["train"].column_names
    traj = [json.loads(line) for line in (a / "trajectories.jsonl").read_text().splitlines()]
    assert all(t["reward"] == 1.0 and t["steps"] and "(exit_code=" in t["steps"][0]["observation"] for t in traj)


def test_the_demo_replaces_only_its_own_training_run(tmp_path):
    """`obsspec demo --out DIR` used to delete any DIR/train holding a recipe.json, a run of
    `obsspec train` included."""
    from obsspec.demo import DEMO_MARK, fresh_train_dir

    train = tmp_path / "train"
    (train / "checkpoints" / "checkpoint-30").mkdir(parents=True)
    (train / "recipe.json").write_text("{}")
    said = []
    assert fresh_train_dir(str(train), lambda text, style=None: said.append(text)) == str(train)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("train.kept-")]
    assert len(kept) == 1 and (kept[0] / "checkpoints" / "checkpoint-30").is_dir(), "another run was not kept"
    assert said and "moved to" in said[0]
    assert sorted(p.name for p in train.iterdir()) == [DEMO_MARK]
    (train / "recipe.json").write_text("{}")  # the demo's own run: replaced
    fresh_train_dir(str(train), said.append)
    assert sorted(p.name for p in train.iterdir()) == [DEMO_MARK] and len(list(tmp_path.iterdir())) == 2


def test_the_demos_curriculum_applies_to_its_suite_only_and_the_command_line_wins():
    from obsspec.demo import DEMO_TRAIN, demo_training

    suite = set(DEMO_TRAIN["task_ids"]) | {"grep-content-00001"}
    assert demo_training(suite, []) == DEMO_TRAIN
    assert "steps" not in demo_training(suite, ["train.steps=3"])
    assert demo_training({"dir-stats-00000"}, []) == {}, "another suite trains as its recipe says"


def test_the_default_suite_holds_the_demos_curriculum():
    """The curriculum names train tasks of the suite tiny-cpu.yaml generates (seed 0): the
    generator and the list change together."""
    from obsspec.config import load_recipe
    from obsspec.demo import DEMO_TRAIN
    from obsspec.env.suite import generate_builtin, split

    cfg = load_recipe("recipes/tiny-cpu.yaml", []).tasks
    train, _ = split(generate_builtin(cfg)[0], cfg.val_fraction, cfg.seed)
    assert set(DEMO_TRAIN["task_ids"]) <= {t.task_id for t in train}


def test_prepare_tasks_from_takes_the_folder_name_as_given(tmp_path):
    """`--from 0x10` imported the folder `16` (the path went through YAML)."""
    (tmp_path / "16").mkdir()
    r = cli("prepare-tasks", "--from", "0x10", "--no-builtin", "--out", "out", cwd=tmp_path)
    assert r.returncode == 2 and "0x10" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_sandbox_that_cannot_start_is_one_line_in_the_shell(tmp_path):
    from obsspec.env.suite import task_by_id

    task = {**task_by_id("dir-stats-00000").to_dict(), "files": {"big.txt": "x" * (2 << 20)}}
    (tmp_path / "train.jsonl").write_text(json.dumps(task) + "\n")
    r = cli("shell", "dir-stats-00000", "--tasks", str(tmp_path), "-c", "ls", "--set", "sandbox.workspace_mb=1",
            "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "could not write the task files: tar: big.txt" in r.stderr, r.stderr[-500:]
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_limits_no_sandbox_can_run_with_are_refused_by_validate():
    for override, message in (("sandbox.memory_mb=8", "sandbox.memory_mb must be at least 128"),
                              ("sandbox.turn_seconds=100000000000000", "sandbox.turn_seconds must be in 0..")):
        r = cli("validate", "recipes/tiny-cpu.yaml", override)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-500:]


@pytest.mark.parametrize("command", ["rollout", "train"])
def test_a_bad_display_is_one_line_before_anything_starts(command, tmp_path):
    r = cli(command, "recipes/tiny-cpu.yaml", "--display", "bogus", "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "--display must be auto, rich, plain or none" in r.stderr, r.stderr[-500:]
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


def test_a_mistyped_reset_key_is_refused():
    r = cli("validate", "recipes/tiny-cpu.yaml", "~sandbox.timeout")
    assert r.returncode == 2 and "unknown key 'sandbox.timeout'" in r.stderr, r.stderr[-500:]
    assert cli("validate", "recipes/tiny-cpu.yaml", "~sandbox.timeout_s").returncode == 0


def test_validate_refuses_what_train_cannot_run():
    """`validate ... train.micro_batch_size=5` said ok, and `train` then exited 2."""
    for override, message in (("train.micro_batch_size=5", "must split evenly"),
                              ("policy.temperature=0", "policy.temperature is 0")):
        r = cli("validate", "recipes/tiny-cpu.yaml", override)
        assert r.returncode == 2 and "`obsspec train` cannot run it" in r.stderr and message in r.stderr, r.stderr


def test_serve_prints_the_servers_command_lines_and_refuses_a_recipe_without_one():
    r = cli("serve", "recipes/terminal-8b.yaml", "--print")
    assert r.returncode == 0, r.stderr
    policy, wm = [line for line in r.stdout.splitlines() if not line.startswith("#")]
    for flag in ("--model Qwen/Qwen3-8B", "--port 8000", "--max-model-len 32768", "--dtype bfloat16",
                 "--enable-lora --max-lora-rank 64", "--logprobs-mode processed_logprobs",
                 "--scheduling-policy priority", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        assert flag in policy, flag
    assert "--model Qwen/Qwen3-0.6B" in wm and "--port 8001" in wm and "processed_logprobs" not in wm
    r = cli("serve", "recipes/terminal-8b.yaml", "servers.policy_gpus=0,1", "servers.world_model_gpus=2", "--print")
    policy, wm = [line for line in r.stdout.splitlines() if not line.startswith("#")]
    assert policy.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True CUDA_VISIBLE_DEVICES=0,1 ")
    assert "--tensor-parallel-size 2" in policy and "CUDA_VISIBLE_DEVICES=2 " in wm and "tensor-parallel" not in wm
    r = cli("serve", "recipes/terminal-8b.yaml", "servers.policy_gpus=first", "--print")
    assert r.returncode == 2 and "servers.policy_gpus must be GPU indices" in r.stderr
    r = cli("serve", "recipes/tiny-cpu.yaml", "--print")
    assert r.returncode == 2 and "no section of this recipe uses engine vllm" in r.stderr
