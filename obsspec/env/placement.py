"""Where episodes' sandboxes run: the recipe keys under `sandbox.ray` (with `sandbox.placement: ray`).

    sandbox:
      placement: ray                  # local (default): on this machine
      ray: {address: auto, cpus: 1, memory_mb: 0, retries: 1}

The sandboxes then run on the workers of a Ray cluster (obsspec/env/ray_sandbox.py), each with
the CPUs and memory its task asks for; the scheduler, the engines and the trainer stay here.
Only the keys live here: Ray itself is imported by ray_sandbox.py, when a sandbox starts there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from obsspec.fields import doc

PLACEMENTS = ("local", "ray")


@dataclass(frozen=True)
class RayPlacement:
    """A sandbox's place on a Ray cluster. Every field is a recipe key under `sandbox.ray:`."""

    address: str = doc("auto", "The cluster: 'auto' (the one `ray start` runs on this machine, or "
                               "RAY_ADDRESS), HOST:PORT of its head (GCS), or 'local' (a private "
                               "one-node Ray started in this process).")
    cpus: float = doc(1.0, "CPUs reserved for each sandbox of a task that names none (a Harbor task's "
                           "[environment] cpus wins).")
    memory_mb: int = doc(0, "Memory reserved for each sandbox of a task that names none, MiB (a "
                            "Harbor task's memory_mb wins); 0 = none reserved.")
    retries: int = doc(0, "Times an episode whose Ray worker or node was lost is run again from its "
                          "start (same seeds: the same tokens); 0 = it stays an infrastructure "
                          "failure, excluded from training and counted.")

    def __post_init__(self) -> None:
        if self.address not in ("auto", "local") and not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d+", self.address):
            raise ValueError(f"sandbox.ray.address must be auto, local or HOST:PORT, not {self.address!r}")
        if not (isinstance(self.cpus, (int, float)) and math.isfinite(self.cpus) and self.cpus > 0):
            raise ValueError(f"sandbox.ray.cpus must be a positive number, not {self.cpus!r}")
        if self.memory_mb < 0 or self.retries < 0:
            raise ValueError("sandbox.ray.memory_mb and sandbox.ray.retries must be >= 0 "
                             f"(got {self.memory_mb}, {self.retries})")
