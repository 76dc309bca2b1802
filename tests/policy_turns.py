"""A run's recorded policy turns, generated again: does a model generate what the policy did?

    same, total = regenerate(engine, fmt, read_trajectories(run / "eval" / "val-after"),
                             temperature=0.7, max_new=48, max_context=1024)

Each policy turn of a recorded trajectory (a run of `policy_mask` 1) is asked again of `engine`
with the request the scheduler made for it (obsspec/rollout/scheduler.py `_request`): the same
context ids, budget, temperature, stop tokens and the seed derived from (episode, turn).
"""

import asyncio
import json
import os


def turns(traj: dict):
    """(context ids, action ids, turn) of each policy turn: the runs of policy_mask 1."""
    out, i, ids, mask = [], 0, traj["ids"], traj["policy_mask"]
    while i < len(ids):
        if mask[i]:
            j = i
            while j < len(ids) and mask[j]:
                j += 1
            out.append((ids[:i], ids[i:j], len(out)))
            i = j
        else:
            i += 1
    return out


def regenerate(engine, fmt, trajectories, temperature, max_new, max_context, sampling_seed=0):
    """Each recorded policy turn generated again: (same, total)."""
    from obsspec.engines.base import GenerationRequest
    from obsspec.rollout.predictors import derive_seed

    async def main():
        same = total = 0
        async with engine:
            for t in trajectories:
                for context, action, turn in turns(t):
                    request = GenerationRequest(context, max_new_tokens=min(max_new, max_context - len(context)),
                                                temperature=temperature, top_p=1.0,
                                                seed=derive_seed(sampling_seed, "policy", t["episode"], turn),
                                                stop_token_ids=fmt.stop_token_ids)
                    total += 1
                    same += list((await engine.generate(request)).token_ids) == action
        return same, total

    return asyncio.run(main())


def read_trajectories(folder) -> list[dict]:
    name = next(p for p in os.listdir(folder) if p.startswith("trajectories-"))
    return [json.loads(x) for x in open(os.path.join(folder, name)).read().splitlines()]
