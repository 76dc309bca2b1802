"""Disk a training run writes per step at a GPU recipe's scale, from the writers' own JSON.

    .venv/bin/python bench/run_disk.py [--recipe recipes/terminal-8b.yaml] [--tokens 32768]
                                      [--out bench/results/run_disk.json]

Nothing is trained or rolled out. One synthetic episode of `--tokens` tokens in the recipe's
shape (its `policy.max_turns` turns, each a 250-token action and the rest observation; token ids
drawn uniformly from the vocabulary, sampled tokens' logprobs drawn like a policy's) is written
as `Trajectory.to_dict()` the way `rollouts/step-N/trajectories-*.jsonl` holds it, plus its
trace lines (about ten events a turn) and its `episodes.jsonl` line; times the recipe's episodes
per step. Adapter versions follow from the models' shapes (obsspec/memory.py): PEFT saves the
fp32 LoRA weights. Uniform ids overstate the digits a little (common tokens have small ids).
"""

from __future__ import annotations

import argparse
import json
import random

from obsspec.config import load_recipe
from obsspec.memory import model_shape
from obsspec.rollout.trajectory import Trajectory, Turn

ACTION_TOKENS = 250


def episode_bytes(tokens: int, turns: int, vocab: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    prompt = 700
    per_turn = (tokens - prompt) // turns
    tr = Trajectory.start(0, "task-00000", [rng.randrange(vocab) for _ in range(prompt)])
    for turn in range(turns):
        action = [rng.randrange(vocab) for _ in range(ACTION_TOKENS)]
        tr.append_action(action, [-rng.expovariate(4.0) for _ in action])
        obs = [rng.randrange(vocab) for _ in range(per_turn - ACTION_TOKENS)]
        tr.append_observation(obs, slice(4, len(obs) - 8), 4)
        tr.turns.append(Turn("x" * 4 * ACTION_TOKENS, "bash", "x" * 80, "y" * 4 * len(obs), 0, 1.5, "match"))
    trajectory = len(json.dumps(tr.to_dict(), sort_keys=True)) + 1
    event = {"kind": "request_end", "t": 123.456789, "episode": 4096, "turn": 17, "request_id": "p-4096-17-0",
             "role": "policy", "outcome": "committed", "reason": "", "tokens": 250, "mode": "speculative"}
    trace = turns * 10 * (len(json.dumps(event, sort_keys=True)) + 1)
    return {"trajectory": trajectory, "trace": trace, "episode_line": 3000}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="recipes/terminal-8b.yaml")
    p.add_argument("--tokens", type=int, default=0, help="tokens an episode (default: policy.max_context)")
    p.add_argument("--out", default="")
    args = p.parse_args()
    recipe = load_recipe(args.recipe)
    pol, t, w = recipe.policy, recipe.train, recipe.wm_train
    tokens = args.tokens or pol.max_context
    policy, wm = model_shape(pol.model), model_shape(recipe.world_model.model)
    per = episode_bytes(tokens, pol.max_turns, policy.vocab)
    episodes = t.episodes_per_step
    step = episodes * sum(per.values())
    policy_version = policy.lora_params(t.policy_lora_rank, t.policy_lora_targets) * 4 if t.policy_lora_rank else 0
    wm_version = wm.lora_params(w.rank, w.target_modules) * 4
    out = {"recipe": args.recipe, "tokens_per_episode": tokens, "turns": pol.max_turns,
           "episodes_per_step": episodes, "steps": t.steps,
           "episode_bytes": per, "rollout_step_bytes": step,
           "rollouts_all_steps_gb": round(step * t.steps / 1e9, 1),
           "policy_version_bytes": policy_version,
           "policy_versions_all_steps_gb": round(policy_version * t.steps / 1e9, 1),
           "wm_version_bytes": wm_version,
           "wm_versions_all_steps_gb": round(wm_version * t.steps / 1e9, 2),
           # co-training rows (ids and mask, JSON) of one step, removed once its round is published
           "cotrain_rows_step_bytes": episodes * tokens * (len(str(policy.vocab // 2)) + 2 + 3)}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
