"""Built-in task families: parameterised, seeded generators of everyday terminal tasks.

Each module in this package defines `NAME` (the family id, kebab-case) and
`generate(rng: random.Random, task_id: str) -> Task`. The generator must draw every choice from
`rng` (never from the clock or global random state) so that the same seed gives the same task.
Modules are discovered automatically, in name order.
"""

from __future__ import annotations

import importlib
import pkgutil
import random
from typing import Callable

from obsspec.env.task import Task

Generator = Callable[[random.Random, str], Task]


def all_families() -> dict[str, Generator]:
    """Family id -> generator, for every module in this package (sorted by module name)."""
    families: dict[str, Generator] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if module.NAME in families:
            raise RuntimeError(f"duplicate task family id {module.NAME!r} in {info.name}")
        families[module.NAME] = module.generate
    return families
