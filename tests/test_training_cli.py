"""`obsspec train` end to end on micro models in real sandboxes: files, co-training, resume after a
kill, the live policy weights, two processes, bad input.

Run: .venv/bin/python -m pytest -q tests/test_training_cli.py
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from obsspec.rollout_run import compare
from obsspec.rollout.trajectory import Trajectory
from test_cli import ROOT, cli
from test_rollout_cli import MICRO

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")]

STEPS = 3


def common(root) -> list[str]:
    return ["recipes/tiny-cpu.yaml", f"rollout.tasks_dir={root / 'tasks'}", f"rollout.kit_cache={root / 'kit'}",
            "policy.max_turns=3", "policy.max_new_tokens=48", "policy.max_context=1024",
            "sandbox.output_cap=200", "world_model.max_tokens=264", "rollout.latency.kind=none",
            "train.tasks_per_step=2", "train.group_size=2", "train.micro_batch_size=2",
            "train.learning_rate=1e-2", "train.warmup_steps=0", "train.cotrain_every=1",
            "train.save_steps=1", "train.save_total_limit=5",
            "train.eval_tasks=2", "train.eval_group_size=2", "train.report_to=none", "train.families=[]",
            "wm_train.max_length=1024", "wm_train.batch_size=2", *MICRO, "policy.temperature=0.3",
            "train.measure_speculation=false",  # (one rollout pass a step; the paired test turns it on)
            "kit.policy.epochs=80"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    r = cli("prepare-tasks", "recipes/tiny-cpu.yaml", "tasks.num_instances=12", "tasks.families=[dir-stats]",
            "tasks.val_fraction=0.25", "tasks.determinism_check=false", "--out", str(root / "tasks"),
            "--display", "none")
    assert r.returncode == 0, r.stderr[-2000:]
    return root


@pytest.fixture(scope="module")
def run(root):
    """An uninterrupted run: the reference for the resume test."""
    r = cli("train", *common(root), f"train.steps={STEPS}", "--out", str(root / "run"), "--display", "plain")
    assert r.returncode == 0, r.stderr[-4000:]
    return root / "run", r


def metrics(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def trajectories(run_dir, step: int) -> list[dict]:
    path = run_dir / "rollouts" / f"step-{step:06d}"
    mode = next(p.name for p in path.iterdir() if p.name.startswith("trajectories-"))
    return [json.loads(x) for x in (path / mode).read_text().splitlines()]


def test_a_run_writes_metrics_rollouts_checkpoints_and_evals(run):
    run_dir, r = run
    rows = metrics(run_dir)
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))
    for m in rows:
        for key in ("loss", "reward", "spec/exact_frac", "success_frac", "infra_failures",
                    "latency_saved_sec", "latency_saved_frac", "spec/class_hits", "wm/version"):
            assert key in m, key
    # step k's episodes train version k, which serves step k+1's rollouts (so it is logged there)
    assert [m["wm/version"] for m in rows] == [None, *range(1, STEPS)], "one adapter version per step"
    assert all(m["wm/swap_sec"] is not None for m in rows[1:]) and rows[-1]["wm/cotrain_failures"] == 0
    assert (run_dir / "world_model" / "adapters" / "latest").exists()
    for step in range(1, STEPS + 1):
        traj = trajectories(run_dir, step)
        assert len(traj) == 4 and all(len(t["ids"]) == len(t["logprobs"]) for t in traj)
        assert (run_dir / "checkpoints" / f"checkpoint-{step}" / "obsspec_state.json").exists()
    evals = json.loads((run_dir / "eval.json").read_text())
    assert evals["before"]["episodes"] == evals["after"]["episodes"] == 4
    for name, key in (("val-before", "before"), ("val-after", "after")):
        # val episodes: sequential (success only), kept apart from the training data in rollouts/
        path = run_dir / "eval" / name
        assert sorted(p.name for p in path.glob("trajectories-*")) == ["trajectories-sequential.jsonl"]
        val = [json.loads(x) for x in (path / "trajectories-sequential.jsonl").read_text().splitlines()]
        assert sum(t["reward"] == 1.0 for t in val) / len(val) == evals[key]["success_frac"]
    assert sorted(p.name for p in (run_dir / "rollouts").iterdir()) == [f"step-{k:06d}" for k in range(1, STEPS + 1)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["wm_version"] >= STEPS - 1 and "hit rate" in r.stderr


def test_steps_take_tasks_in_the_interleaved_order_and_count_success_per_kind(root, run):
    # TRL's shuffle is off: step k trains on the next tasks of obsspec's kind-interleaved order,
    # each `group_size` times, and each step's success is also counted per question kind.
    run_dir, r = run
    from obsspec.env.suite import interleave, load_tasks

    order = [t.task_id for t in interleave(load_tasks(root / "tasks" / "train.jsonl"), seed=0)]
    rows = metrics(run_dir)
    for step, row in enumerate(rows, 1):
        episodes = [json.loads(x)["task"] for x in
                    (run_dir / "rollouts" / f"step-{step:06d}" / "episodes.jsonl").read_text().splitlines()]
        assert [e["task_id"] for e in episodes] == [i for i in order[2 * step - 2:2 * step] for _ in range(2)]
        assert all(e["kind"] for e in episodes)
        by_kind = row["success_by_kind"]
        assert set(by_kind) == {f"dir-stats/{e['kind']}" for e in episodes}
        assert sum(n for _, n in by_kind.values()) == 4
        assert sum(w for w, _ in by_kind.values()) / 4 == row["success_frac"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["success_by_kind"]) >= set(rows[0]["success_by_kind"])
    assert "dir-stats/" in r.stdout.split("success, first")[1]  # the end-of-run table shows them


def test_report_reads_a_training_run(run, tmp_path):
    run_dir, _ = run
    r = cli("report", str(run_dir), "--out", str(tmp_path / "report"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "report" / "hit_rate.png").exists() and (tmp_path / "report" / "reward.png").exists()
    assert "success per question kind" in (tmp_path / "report" / "report.html").read_text()


def test_resume_refuses_a_run_begun_under_another_task_order(root, run, tmp_path):
    # a run started before tasks were kind-interleaved has no task_order in its recipe.json
    old = tmp_path / "old"
    shutil.copytree(run[0], old)
    saved = json.loads((old / "recipe.json").read_text())
    assert saved.pop("task_order") == "kind-interleaved"
    (old / "recipe.json").write_text(json.dumps(saved))
    r = cli("train", *common(root), f"train.steps={STEPS}", "--out", str(old), "--display", "none", "--resume")
    assert r.returncode == 2 and "task_order" in r.stderr, r.stderr[-2000:]


# Runs `obsspec ARGS...` and SIGKILLs itself at POINT of checkpoint-STEP's save: `before` the
# trainer's save, `mid-save` (the model written; optimizer, RNG, trainer state not), then the points
# of obsspec/training/checkpoints.py: `trainer-saved`, `state-written`, `complete`.
KILLER = """
import os, signal, sys
import transformers
from obsspec.training import checkpoints

point, step = sys.argv[1], int(sys.argv[2])

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

def kill_before(method, name):
    original = getattr(transformers.Trainer, method)
    def wrapped(self, *args, **kwargs):
        if point == name and self.state.global_step == step:
            kill()
        return original(self, *args, **kwargs)
    setattr(transformers.Trainer, method, wrapped)

kill_before("_save_checkpoint", "before")
kill_before("_save_optimizer_and_scheduler", "mid-save")
checkpoints.reached = lambda name, d: kill() if name == point and checkpoints.step_of(d) == step else None
from obsspec.cli import app
app(sys.argv[3:], prog_name="obsspec")
"""

# (where the run is killed, in which step's save, the complete checkpoints left, the interrupted ones)
KILLS = [("before", 1, [], []),
         ("mid-save", 1, [], [1]),
         ("complete", 1, [1], []),
         ("trainer-saved", 2, [1], [2]),   # save_total_limit=1 must not have taken checkpoint-1
         ("state-written", 2, [1], [2])]


def test_resume_after_a_kill_at_any_point_of_a_save_repeats_no_step_and_skips_none(root, run):
    """Kill the run (SIGKILL) at each point of a checkpoint's save in turn, resuming each time:
    a checkpoint is complete or skipped (with one line naming both), and the run ends as the
    uninterrupted one did: the same steps, the same episodes token for token, the same rewards."""
    from obsspec.training.checkpoints import find_checkpoints

    ref_dir, _ = run
    out = root / "killed"
    args = ["train", *common(root), f"train.steps={STEPS}", "train.save_total_limit=1", "--out", str(out),
            "--display", "plain"]
    resumed_from = None  # (the complete checkpoint, the interrupted ones) the next resume must name
    for i, (point, step, complete, interrupted) in enumerate(KILLS):
        r = subprocess.run([sys.executable, "-c", KILLER, point, str(step), *args, *(["--resume"] if i else [])],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == -signal.SIGKILL, f"not killed at {point} of step {step}: {r.stderr[-3000:]}"
        if resumed_from is not None:
            assert_resume_line(r.stderr, *resumed_from)
        found = find_checkpoints(str(out / "checkpoints"))
        assert [int(p.rsplit("-", 1)[1]) for p in found.complete] == complete, f"killed at {point} of step {step}"
        assert [int(p.rsplit("-", 1)[1]) for p in found.incomplete] == interrupted, f"killed at {point} of step {step}"
        resumed_from = (complete[-1] if complete else None, interrupted)
        if i == 0:
            again = cli(*args)  # without --resume: refused, nothing touched
            assert again.returncode == 2 and "--resume" in again.stderr

    r = cli(*args, "--resume")
    assert r.returncode == 0, r.stderr[-4000:]
    assert_resume_line(r.stderr, *resumed_from)
    assert sorted(n for n in os.listdir(out / "checkpoints") if "checkpoint-" in n) == [f"checkpoint-{STEPS}"], \
        "save_total_limit=1 keeps the newest complete checkpoint only"
    got, want = metrics(out), metrics(ref_dir)
    assert [m["step"] for m in got] == [m["step"] for m in want] == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        a = [Trajectory.from_dict(t) for t in trajectories(out, step)]
        b = [Trajectory.from_dict(t) for t in trajectories(ref_dir, step)]
        c = compare(a, b)
        assert not c["differing_first_in_action"], \
            f"step {step}: episodes {c['differing_first_in_action']} differ in an action after resume"
        if c["differing_first_in_observation"]:
            # A tool printed something else the second time (e.g. two failing pipeline stages
            # racing on stderr): from here the two runs legitimately train on different data.
            break
        assert got[step - 1]["reward"] == want[step - 1]["reward"]
    assert got[-1]["wm/version"] is not None


def assert_resume_line(stderr: str, complete, interrupted) -> None:
    lines = [x for x in stderr.splitlines() if x.startswith("resuming from")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    want = f"checkpoint-{complete} (step {complete})" if complete else "step 0: "
    assert want in lines[0], lines[0]
    for step in interrupted:
        assert f"checkpoint-{step}" in lines[0].split("skipping", 1)[1], lines[0]
    assert ("skipping" in lines[0]) == bool(interrupted), lines[0]


def test_resume_refuses_a_changed_recipe_and_a_missing_run(root, run, tmp_path):
    run_dir, _ = run
    r = cli("train", *common(root), f"train.steps={STEPS + 1}", "--out", str(run_dir), "--resume",
            "--display", "none")
    assert r.returncode == 2 and "differs" in r.stderr and "train" in r.stderr
    r = cli("train", *common(root), "--out", str(tmp_path / "nothing"), "--resume", "--display", "none")
    assert r.returncode == 2 and "no training run to resume" in r.stderr
    r = cli("train", *common(root), "train.families=[no-such-family]", "--out", str(tmp_path / "fam"),
            "--display", "none")
    assert r.returncode == 2 and "no train tasks of the families" in r.stderr
    # that failed start left no step behind, so starting again needs no --resume
    assert "already holds" not in cli("train", *common(root), "train.families=[no-such-family]", "--out",
                                      str(tmp_path / "fam"), "--display", "none").stderr
    # another run's val-before (eval.json) is never taken for this one's; a broken run file is one line
    (tmp_path / "fam" / "eval.json").write_text('{"before": {"success_frac": 1.0}}')
    r = cli("train", *common(root), "--out", str(tmp_path / "fam"), "--display", "none")
    assert r.returncode == 2 and "already holds" in r.stderr
    (tmp_path / "fam" / "recipe.json").write_text("{broken")
    r = cli("train", *common(root), "--out", str(tmp_path / "fam"), "--resume", "--display", "none")
    assert r.returncode == 2 and "not a readable run file" in r.stderr and "Traceback" not in r.stderr


def test_dry_run_loads_nothing_and_bad_batch_shapes_are_one_line(tmp_path):
    r = cli("train", "recipes/terminal-8b.yaml", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["per_step"]["episodes"] == 256 and plan["policy"]["model"] == "Qwen/Qwen3-8B"
    r = cli("train", "recipes/tiny-cpu.yaml", "train.micro_batch_size=5", "--dry-run")
    assert r.returncode == 2 and "split evenly" in r.stderr and "Traceback" not in r.stderr
    r = cli("train", "recipes/tiny-cpu.yaml", "train.group_size=1")
    assert r.returncode == 2 and "group_size" in r.stderr


def test_two_processes_on_cpu(root, run):
    """Two processes on CPU (torchrun, gloo): each rolls out its half of the step's episodes, the
    rewards are gathered for the group baselines, DDP averages the gradients, a checkpoint a step;
    the world model co-trained on both ranks' episodes after step 1 is the version both draft
    with at step 2, and the metrics give each rank's hit rate."""
    launcher = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = root / "two"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:  # (not torchrun's fixed default: another test may be training beside this one)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([launcher, "--nproc_per_node", "2", "--master_port", str(port), "-m", "obsspec", "train",
                        *common(root), "train.steps=2", "train.eval_tasks=0", "--out", str(out),
                        "--display", "none"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = metrics(out)
    assert [m["step"] for m in rows] == [1, 2], "only the main process writes metrics.jsonl"
    assert rows[0]["episodes"] == 4 and rows[0]["processes"] == 2, "the metrics are not of both processes' episodes"
    assert {"spec/exact_frac/rank0", "spec/exact_frac/rank1"} <= set(rows[1]), "no hit rate per rank"
    adapters = [json.loads((out / "rollouts" / f"step-000002{r}" / "summary.json").read_text())["world_model_adapter"]
                for r in ("", ".rank1")]
    assert adapters == ["wm-v1", "wm-v1"], f"the ranks drafted with different world models at step 2: {adapters}"
    step1 = [t for r in ("", ".rank1") for t in
             (out / "rollouts" / f"step-000001{r}" / "trajectories-speculative.jsonl").read_text().splitlines()]
    assert len(step1) == 4 and rows[1]["wm/examples"] >= 4, \
        f"co-training learnt from {rows[1]['wm/examples']} rows, not from both ranks' 4 episodes"
    assert (out / "rollouts" / "step-000001").is_dir() and (out / "rollouts" / "step-000001.rank1").is_dir()
    assert len(trajectories(out, 1)) == 2, "rank 0 rolled out its half of the 4 episodes"
    episodes = [json.loads(x)["episode"] for x in
                (out / "rollouts" / "step-000001.rank1" / "episodes.jsonl").read_text().splitlines()]
    assert episodes == [2, 3], "rank 1's episodes (and seeds) follow rank 0's"
    assert (out / "checkpoints" / "checkpoint-2").is_dir()
    assert "Writing model shards" not in r.stderr + r.stdout, "a progress bar of the checkpoint garbles the display"


def _digest(model) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "policy-lora"])
def test_rollouts_of_step_k_plus_1_run_on_the_weights_step_k_left(root, tmp_path, monkeypatch, lora_rank):
    """In process: the weights the engine serves when step k+1's rollouts start are the trainer's
    weights after step k's update (which changed them), and the logprobs the rollouts return are
    exactly that model's (recomputed with a plain forward pass). With a policy LoRA too: PEFT
    puts its layers into the very model the hf engine serves."""
    import torch

    from obsspec.config import load_recipe
    from obsspec.training import grpo, rollouts as R, setup as S

    at_rollout, after_step = {}, {}
    call, on_log = R.Rollouts.__call__, S.MetricsLog.on_log

    def spy_call(self, prompts, trainer):
        step = trainer.state.global_step + 1
        model = self.policy.model
        at_rollout[step] = _digest(model)
        out = call(self, prompts, trainer)
        temperature = self.settings.sampling.temperature
        with torch.no_grad():
            for p, c, lp, m in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
                ids = torch.tensor([p + c])
                logits = model(ids).logits[0, len(p) - 1:-1].float() / temperature
                want = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None])[:, 0]
                for i, keep in enumerate(m):
                    if keep:
                        assert abs(want[i].item() - lp[i]) < 1e-3, \
                            f"step {step}: a sampled token's logprob is not the live model's"
        return out

    def spy_log(self, args, state, control, logs=None, **kw):
        after_step[state.global_step] = _digest(kw["model"])  # the trainer's model, as TRL holds it
        return on_log(self, args, state, control, logs=logs, **kw)

    def alternating(self, prompts=None, completions=None, verifier_reward=None, **kw):
        return [float(i % 2) for i in range(len(verifier_reward))]  # every group has signal

    monkeypatch.setattr(R.Rollouts, "__call__", spy_call)
    monkeypatch.setattr(R.Rollouts, "reward", alternating)
    monkeypatch.setattr(S.MetricsLog, "on_log", spy_log)
    recipe = load_recipe(common(root)[0], [*common(root)[1:], "train.steps=3", "train.eval_tasks=0",
                                            "train.cotrain_every=0", f"train.policy_lora_rank={lora_rank}",
                                            "train.report_to=tensorboard"])
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    grpo.run_training(recipe, str(tmp_path / "live"))
    # the two parametrizations are two runs in this one process: each logs to its own folder
    assert list((tmp_path / "live" / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard log in the run"
    assert "TENSORBOARD_LOGGING_DIR" not in os.environ
    assert sorted(at_rollout) == [1, 2, 3] and sorted(after_step) == [1, 2, 3]
    for k in (1, 2):
        assert at_rollout[k + 1] == after_step[k], f"step {k + 1}'s rollouts did not use step {k}'s weights"
        assert after_step[k] != at_rollout[k], f"step {k}'s update did not change the weights"


def test_a_vllm_policy_server_gets_each_steps_lora_and_rollouts_stay_on_policy(root, run, tmp_path, monkeypatch):
    """policy.engine=vllm: the rollouts generate on a server (here a local server speaking vLLM's
    API over a real hf engine), the trainer trains a policy LoRA, and before every round of
    rollouts the adapter the last update left is loaded there under a new name. Checked: the load
    order, the adapter every generation named, and that the logprobs the server returned for each
    step's sampled tokens are the trainer's model's at that moment (recomputed), while the base
    model's differ after the first update."""
    import torch

    from fakes import VLLMProtocolServer
    from obsspec.config import load_recipe
    from obsspec.engines.hf import HFEngine
    from obsspec.models.tiny import load_pretrained
    from obsspec.build import model_paths
    from obsspec.training import grpo, rollouts as R
    from obsspec.progress import NullDisplay

    base = common(root)
    policy_path, _ = model_paths(load_recipe(base[0], base[1:]), NullDisplay())
    served, tokenizer = load_pretrained(policy_path)
    checked = {}
    call = R.Rollouts.__call__

    def spy_call(self, prompts, trainer):
        out = call(self, prompts, trainer)
        step, model = trainer.state.global_step + 1, trainer.model
        temperature = self.settings.sampling.temperature
        worst = {"trainer": 0.0, "base": 0.0}
        with torch.no_grad():
            for p, c, lp, m in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
                ids = torch.tensor([p + c])
                for name in worst:
                    if name == "base":
                        with model.disable_adapter():
                            logits = model(input_ids=ids).logits
                    else:
                        logits = model(input_ids=ids).logits
                    want = torch.log_softmax(logits[0, len(p) - 1:-1].float() / temperature, -1)
                    want = want.gather(1, torch.tensor(c)[:, None])[:, 0]
                    for i, keep in enumerate(m):
                        if keep:
                            worst[name] = max(worst[name], abs(want[i].item() - lp[i]))
        checked[step] = (self.policy_adapter, worst)
        return out

    def alternating(self, prompts=None, completions=None, verifier_reward=None, **kw):
        return [float(i % 2) for i in range(len(verifier_reward))]  # every group has signal

    monkeypatch.setattr(R.Rollouts, "__call__", spy_call)
    monkeypatch.setattr(R.Rollouts, "reward", alternating)
    engine = HFEngine(served, tokenizer, batch_invariant=True)
    try:
        with VLLMProtocolServer(engine, policy_path) as server:
            recipe = load_recipe(base[0], [*base[1:], "train.steps=3", "train.cotrain_every=0",
                                           "policy.engine=vllm", f"policy.server_url={server.url}",
                                           "train.policy_lora_rank=4", "train.eval_tasks=1"])
            grpo.run_training(recipe, str(tmp_path / "vllm"))
    finally:
        engine.close()
    loads = [(p.rsplit("/", 1)[-1], name) for p, name in server.calls if "lora" in p]
    assert loads == [("load_lora_adapter", "policy-v1"),
                     ("load_lora_adapter", "policy-v2"), ("unload_lora_adapter", "policy-v1"),
                     ("load_lora_adapter", "policy-v3"), ("unload_lora_adapter", "policy-v2"),
                     ("load_lora_adapter", "policy-v4"), ("unload_lora_adapter", "policy-v3")]
    generated = [name for p, name in server.calls if p.endswith("completions")]
    blocks = [name for i, name in enumerate(generated) if i == 0 or generated[i - 1] != name]
    assert blocks == [policy_path, "policy-v1", "policy-v2", "policy-v3", "policy-v4"], \
        "val before (the base), steps 1-3 (the adapter the previous update left), val after"
    assert sorted(checked) == [1, 2, 3]
    for step, (adapter, worst) in checked.items():
        assert adapter == f"policy-v{step}"
        assert worst["trainer"] < 1e-3, f"step {step}: the server did not sample from the trainer's weights"
    assert max(checked[3][1]["base"], checked[2][1]["base"]) > 1e-2, "the updates changed nothing"
    rows = metrics(tmp_path / "vllm")
    assert [r["policy/version"] for r in rows] == [1, 2, 3]


def test_paired_steps_measure_speculation_on_the_same_seeds(root, run, tmp_path):
    """train.measure_speculation: every step's episodes run speculatively and sequentially on the
    same seeds, both written to the step's folder; the speculative pass trains (the same tokens
    as the plain run's), the measured reductions reach metrics.jsonl, the step line and the
    summary (with an interval over the steps), and the batch-invariant passes are token-identical."""
    out = tmp_path / "paired"
    r = cli("train", *common(root), "train.steps=2", "train.measure_speculation=true", "train.cotrain_every=0",
            "--out", str(out), "--display", "plain")
    assert r.returncode == 0, r.stderr[-4000:]
    rows = metrics(out)
    for m in rows:
        for key in ("paired/rollout_reduction", "paired/seq_sec", "paired/spec_sec", "paired/episodes_differing"):
            assert m.get(key) is not None, key
        assert m["paired/episodes_differing"] == 0 and m["paired/tokens_differing"] == 0, \
            "batch-invariant passes of the same seeds must be token-identical"
    for step in (1, 2):
        folder = out / "rollouts" / f"step-{step:06d}"
        assert {p.name for p in folder.iterdir()} >= {"trajectories-sequential.jsonl", "trajectories-speculative.jsonl"}
        assert json.loads((folder / "summary.json").read_text())["comparison"]["token_identical"]
        spec = [json.loads(x) for x in (folder / "trajectories-speculative.jsonl").read_text().splitlines()]
        plain = trajectories(run[0], step)
        assert [t["ids"] for t in spec] == [t["ids"] for t in plain], "the speculative pass is not what trains"
    summary = json.loads((out / "summary.json").read_text())
    paired = summary["paired"]
    assert paired["steps"] == 2 and paired["rollout_reduction"]["ci95"] is not None
    assert "sequential (" in r.stderr + r.stdout, "the step line shows the measured figure"
