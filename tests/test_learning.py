"""GRPO through obsspec optimises: a real `obsspec train`, in real sandboxes, on tasks the shipped
tiny policy half solves, raises their reward.

The setting is the smallest one where the policy must learn: two count-lines tasks whose file
names the pretrained policy copies right about a quarter of the time (0.25 and 0.25 over 8
episodes each), trained on again and again (2 tasks x 8 episodes a step, lr 3e-4, 10 steps).
Everything else is the embedded default: its bases, its sandbox, its rollout temperature. It
guards the learning loop end to end — the advantage's sign, the loss mask on the policy's own
tokens, the temperature of the trainer's logprobs, the rows handed to TRL: with the reward's sign
flipped the reward falls to 0 by step 7; with the loss on observation tokens the first step's
logprob check stops the run.

Run: .venv/bin/python -m pytest -q tests/test_learning.py   (about 3 minutes on 2 cores)
"""

import json
import pathlib
import shutil

import pytest

from test_cli import ROOT, cli

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")]

TASKS = ("count-lines-00018", "count-lines-00025")  # of the suite below: each solved 2 of 8 times
BASES = pathlib.Path(ROOT) / "obsspec" / "bases" / "tiny-cpu"


@pytest.mark.timeout(900)
def test_grpo_raises_the_reward_of_tasks_the_policy_half_solves(tmp_path):
    suite = tmp_path / "tasks"
    r = cli("prepare-tasks", "recipes/tiny-cpu.yaml", "tasks.families=[count-lines]", "tasks.num_instances=40",
            "tasks.determinism_check=false", "--out", str(suite), "--display", "none")
    assert r.returncode == 0, r.stderr[-2000:]
    train = [line for line in (suite / "train.jsonl").read_text().splitlines()
             if json.loads(line)["task_id"] in TASKS]
    assert len(train) == 2, "the suite's generator changed: pick two train tasks the policy solves ~25% of the time"
    (suite / "train.jsonl").write_text("\n".join(train) + "\n")
    r = cli("train", "recipes/tiny-cpu.yaml", f"rollout.tasks_dir={suite}", f"policy.model={BASES / 'policy'}",
            f"world_model.model={BASES / 'world_model'}", "train.speculative=false", "train.steps=10",
            "train.tasks_per_step=2", "train.group_size=8", "train.eval_tasks=0", "train.learning_rate=3e-4",
            "train.warmup_steps=0", "train.save_steps=100", "train.report_to=none",
            "--out", str(tmp_path / "run"), "--display", "plain")
    assert r.returncode == 0, r.stderr[-3000:]
    rewards = [json.loads(x)["reward"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rewards) == 10
    assert rewards[0] <= 0.3, f"the policy already solves these tasks ({rewards[0]}): the test shows nothing"
    last = sum(rewards[-3:]) / 3
    assert last >= 0.7, (f"GRPO did not raise the reward: {rewards} (the last three steps' mean {last:.2f} "
                         "< 0.7): the learning loop does not optimise the verifier's reward")
