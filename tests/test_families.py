"""Built-in task families: seeded, varied, and valid in the real sandbox.

Validity is the invariant every built-in task keeps (docs/ENVIRONMENT.md): its reference
solution passes its verifier, and an episode that does nothing fails it.
"""

import asyncio
import random
import shutil

import pytest

from obsspec.env.episode import run_scripted
from obsspec.env.families import all_families
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.suite import builtin_task, instance_seed, task_by_id
from obsspec.env.task import Task

FAMILIES = sorted(all_families())
CONFIG = SandboxConfig(timeout_s=10)


def test_there_are_at_least_twenty_families():
    assert len(FAMILIES) >= 20, FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_task_and_many_distinct_instances(family):
    a = builtin_task(family, 7, seed=3)
    b = builtin_task(family, 7, seed=3)
    assert a == b and a.content_hash() == b.content_hash()
    assert a.family == family and a.task_id == f"{family}-00007"
    assert 2 <= len(a.solution) <= 8, "reference solutions should take several turns"
    distinct = {builtin_task(family, i).content_hash() for i in range(60)}
    assert len(distinct) >= 50, f"{family}: only {len(distinct)} distinct instances of 60"


@pytest.mark.parametrize("family", FAMILIES)
def test_task_round_trips_through_json(family):
    t = builtin_task(family, 1)
    assert Task.from_dict(t.to_dict()) == t
    assert task_by_id(t.task_id) == t


def test_instance_seed_is_stable():
    # a fixed value: if this changes, every generated suite changes
    assert instance_seed(0, "find-by-name", 0) == instance_seed(0, "find-by-name", 0)
    assert instance_seed(0, "a", 1) != instance_seed(0, "a", 2)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
@pytest.mark.parametrize("family", FAMILIES)
def test_reference_passes_and_doing_nothing_fails(family):
    async def check(index):
        task = builtin_task(family, index)
        ref = await run_scripted(task, task.solution, CONFIG)
        idle = await run_scripted(task, [], CONFIG)
        return task, ref, idle

    async def go():
        return await asyncio.gather(*(check(i) for i in range(3)))

    for task, ref, idle in asyncio.run(go()):
        assert not ref.infra_error, ref.infra_error
        assert ref.reward == 1.0, f"{task.task_id}: reference scored {ref.reward}: {ref.steps}"
        assert idle.reward < 1.0, f"{task.task_id}: doing nothing passes the verifier"


def test_at_least_a_thousand_distinct_instances():
    from obsspec.config import TasksConfig
    from obsspec.env.suite import generate_builtin

    tasks, dropped = generate_builtin(TasksConfig(num_instances=1100))
    assert len({t.content_hash() for t in tasks}) >= 1000, f"{len(dropped)} duplicates dropped"
