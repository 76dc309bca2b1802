"""Task suites: generate, import, validate and write them (`obsspec prepare-tasks`).

    summary = asyncio.run(prepare_tasks(recipe.tasks, recipe.sandbox, out_dir="runs/tasks", display=NullDisplay()))

Output (under `out_dir`):
- `train.jsonl`, `val.jsonl`    one Task per line (`datasets.load_dataset("json", ...)` reads them)
- `trajectories.jsonl`           the reference solutions with their real observations
- `manifest.json`                counts per family, content hashes, dropped instances and why
- `determinism.json`             commands whose observations differed between two fresh runs
- `summary.json`                 key figures, including timings (the only non-reproducible file)
Same seed, same output: every file but summary.json is byte-identical across runs.
An interrupted run resumes: validated instances are kept in `validation.partial.jsonl` (removed
when the run completes) and are not run again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from obsspec.env.audit import FLAG_ONLY, MODES, audit
from obsspec.env.episode import EpisodeRecord, preflight, run_scripted
from obsspec.env.families import all_families
from obsspec.env.images import ImageUnavailable
from obsspec.env.sandbox import SandboxConfig, output_settings
from obsspec.env.semantics import ISOLATED, NAMES
from obsspec.env.task import Task
from obsspec.fields import doc, to_dict
from obsspec.progress import Display


class SuiteError(ValueError):
    """A task suite the user gave cannot be read: one line, naming the file and line."""


class TaskNotFound(SuiteError):
    pass


# ---------------------------------------------------------------------------------------------
# Generation


@dataclass(frozen=True)
class TasksConfig:
    """The recipe's `tasks` section: which tasks a suite holds and how they are checked."""

    builtin: bool = doc(True, "Generate the built-in task families (obsspec/env/families).")
    families: tuple[str, ...] = doc((), "Built-in families the suite is made of; empty = all of them "
                                        "(train.families picks among them for training).")
    num_instances: int = doc(1000, "How many built-in instances to generate (spread over families).")
    seed: int = doc(0, "Seed of the task generators: same seed, byte-identical task suite.")
    val_fraction: float = doc(0.1, "Fraction of instances (per family) held out as validation.")
    harbor_dir: str = doc("", "A Harbor-layout task folder (or folder of them) to import as well.")
    harbor_semantics: str = doc("harbor", "How imported Harbor tasks run: 'harbor' (as Harbor runs "
                                          "them, in a container: services live on, the image's "
                                          "USER (root), one HOME and the real clock) or 'isolated' "
                                          "(the built-in families' deterministic sandbox).")
    determinism_check: bool = doc(True, "Run each reference solution twice and report which "
                                        "observations differ (the ceiling of any world model's hit rate).")
    workers: int = doc(4, "Sandboxes validated concurrently.")
    cheat_audit: str = doc("drop", "Imported tasks a cheap cheat passes (obsspec/env/audit.py: emptied or "
                                   "deleted inputs, placeholder answers, a failed run's outputs): "
                                   "'drop' them, 'flag' them in the manifest, or 'off' (no audit).")

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError("tasks.val_fraction must be in [0, 1)")
        if self.num_instances < 0 or self.workers < 1:
            raise ValueError("tasks.num_instances must be >= 0 and tasks.workers >= 1")
        if self.cheat_audit not in MODES:
            raise ValueError(f"tasks.cheat_audit must be one of {', '.join(MODES)}, not {self.cheat_audit!r}")
        if self.harbor_semantics not in NAMES:
            raise ValueError(f"tasks.harbor_semantics must be one of {', '.join(NAMES)}, not {self.harbor_semantics!r}")


def instance_seed(seed: int, family: str, index: int) -> int:
    """A stable per-instance seed (independent of Python's hash randomisation)."""
    digest = hashlib.sha256(f"{seed}/{family}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def builtin_task(family: str, index: int, seed: int = 0) -> Task:
    families = all_families()
    if family not in families:
        raise TaskNotFound(f"unknown task family {family!r} (known: {', '.join(sorted(families))})")
    return families[family](random.Random(instance_seed(seed, family, index)), f"{family}-{index:05d}")


def task_by_id(task_id: str, seed: int = 0) -> Task:
    """Rebuild a built-in task from its id, e.g. 'find-by-name-00003'."""
    family, _, index = task_id.rpartition("-")
    if not family or not index.isdigit():
        raise TaskNotFound(f"not a built-in task id: {task_id!r} (expected FAMILY-NNNNN)")
    return builtin_task(family, int(index), seed)


def generate_builtin(cfg: TasksConfig) -> tuple[list[Task], list[dict]]:
    """`cfg.num_instances` tasks spread evenly over the families; exact duplicates dropped."""
    families = all_families()
    names = list(cfg.families) or sorted(families)
    unknown = [n for n in names if n not in families]
    if unknown:
        raise TaskNotFound(f"unknown task family {unknown[0]!r} (known: {', '.join(sorted(families))})")
    tasks, dropped, seen = [], [], {}
    for i in range(cfg.num_instances):
        family, index = names[i % len(names)], i // len(names)
        task = builtin_task(family, index, cfg.seed)
        key = identity(task)
        if key in seen:
            dropped.append({"task_id": task.task_id, "reason": f"duplicate of {seen[key]}", "kind": "duplicate"})
            continue
        seen[key] = task.task_id
        tasks.append(task)
    return tasks, dropped


def identity(task: Task) -> str:
    """sha256 of what the task is, whatever its id: equal tasks under two ids are one."""
    d = task.to_dict()
    d.pop("task_id")
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def split(tasks: list[Task], val_fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    """Per-family seeded split, so that every family appears in validation."""
    by_family: dict[str, list[Task]] = {}
    for t in tasks:
        by_family.setdefault(t.family, []).append(t)
    train, val = [], []
    for family in sorted(by_family):
        group = sorted(by_family[family], key=lambda t: t.task_id)
        random.Random(f"{seed}/split/{family}").shuffle(group)
        n_val = round(len(group) * val_fraction)
        if val_fraction > 0 and n_val == 0 and len(group) > 1:
            n_val = 1
        val += group[:n_val]
        train += group[n_val:]
    return sorted(train, key=lambda t: t.task_id), sorted(val, key=lambda t: t.task_id)


# ---------------------------------------------------------------------------------------------
# Validation


@dataclass
class Validation:
    task: Task
    reference: EpisodeRecord | None = None
    idle: EpisodeRecord | None = None
    repeat: EpisodeRecord | None = None
    problem: str = ""  # why the instance is dropped ('' = valid)
    differing: list[dict] = field(default_factory=list)
    kind: str = ""  # the class of `problem` (the manifest counts dropped tasks per kind)
    cheats: list[str] | None = None  # cheats that pass its verifier (None: not audited)


async def validate_task(task: Task, config: SandboxConfig, determinism: bool, cheat_audit: str = "off") -> Validation:
    v = Validation(task)
    if not task.solution:
        v.problem, v.kind = "no reference solution", "no-solution"
        return v
    v.reference = await run_scripted(task, task.solution, config)
    v.idle = await run_scripted(task, [], config)
    for name, rec in (("reference", v.reference), ("do-nothing", v.idle)):
        if rec.infra_error:
            v.problem, v.kind = f"{name} episode failed in the sandbox: {rec.infra_error}", "sandbox-error"
            return v
    if v.reference.reward < 1.0:
        v.problem, v.kind = f"reference solution scored {v.reference.reward:g} (must be 1)", "reference-failed"
    elif v.idle.reward >= 1.0:
        v.problem, v.kind = "a do-nothing episode passes the verifier", "do-nothing-passes"
    if cheat_audit != "off" and task.source.startswith("harbor:") and not v.problem:
        v.cheats = await audit(task, config)
        exploits = [c for c in v.cheats if c not in FLAG_ONLY]
        if exploits and cheat_audit == "drop":
            v.problem, v.kind = f"a cheap cheat passes the verifier: {', '.join(exploits)}", "cheat-passes"
    if determinism and not v.problem:
        v.repeat = await run_scripted(task, task.solution, config, verify=False)
        for i, (a, b) in enumerate(zip(v.reference.steps, v.repeat.steps)):
            if a.observation != b.observation:
                v.differing.append({"task_id": task.task_id, "turn": i, "command": a.command,
                                    "first": a.observation, "second": b.observation})
    return v


async def validate_all(tasks: list[Task], config: SandboxConfig, workers: int, determinism: bool,
                       display: Display, checkpoint: str = "", cheat_audit: str = "off") -> list[Validation]:
    """Validate tasks concurrently. With `checkpoint`, each result is appended to that JSONL file
    as it completes and reused by a rerun, so an interrupted prepare-tasks resumes."""
    gate = asyncio.Semaphore(workers)
    done = _load_checkpoint(checkpoint)
    sink = open(checkpoint, "a") if checkpoint else None
    display.start(len(tasks), "validating tasks in the sandbox")

    async def one(task: Task) -> Validation:
        key = _checkpoint_key(task, config, determinism, cheat_audit)
        if key in done:
            v = _validation_from(task, done[key])
        else:
            async with gate:
                try:
                    v = await validate_task(task, config, determinism, cheat_audit)
                except ValueError as e:  # this task's fault (content the sandbox refuses):
                    # dropped with the reason; raised, it left its siblings hanging mid-start.
                    # (A bug of ours still raises.)
                    kind = "image" if isinstance(e, ImageUnavailable) else "refused"
                    v = Validation(task, problem=f"could not be run: {type(e).__name__}: {e}", kind=kind)
            if sink is not None and not _infra_failed(v):
                sink.write(json.dumps(_validation_to(key, v), sort_keys=True) + "\n")
                sink.flush()
        display.advance(1)
        return v

    try:
        return await asyncio.gather(*(one(t) for t in tasks))
    finally:
        display.finish()
        if sink is not None:
            sink.close()


def _checkpoint_key(task: Task, config: SandboxConfig, determinism: bool, cheat_audit: str = "off") -> str:
    blob = json.dumps([task.to_dict(), output_settings(config), determinism, cheat_audit], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _infra_failed(v: Validation) -> bool:
    # infrastructure failures are retried on resume, never cached as the task's fault
    return any(r is not None and r.infra_error for r in (v.reference, v.idle, v.repeat))


def _validation_to(key: str, v: Validation) -> dict:
    rec = {name: (getattr(v, name).to_dict(with_timing=True) if getattr(v, name) else None)
           for name in ("reference", "idle", "repeat")}
    return {"key": key, "problem": v.problem, "kind": v.kind, "differing": v.differing, "cheats": v.cheats, **rec}


def _validation_from(task: Task, d: dict) -> Validation:
    recs = {n: EpisodeRecord.from_dict(d[n]) if d[n] else None for n in ("reference", "idle", "repeat")}
    return Validation(task, problem=d["problem"], differing=d["differing"], kind=d.get("kind", ""),
                      cheats=d.get("cheats"), **recs)


def suite_settings(cfg: TasksConfig) -> dict:
    """The tasks section that decides what a suite holds (how many workers built it does not, nor
    how Harbor tasks run when none are imported)."""
    drop = {"workers"} | (set() if cfg.harbor_dir else {"harbor_semantics", "cheat_audit"})
    return {k: v for k, v in to_dict(cfg).items() if k not in drop}


def _load_checkpoint(path: str) -> dict[str, dict]:
    if not path or not os.path.exists(path):
        return {}
    done = {}
    with open(path, "rb") as f:
        for line in f:
            try:
                d = json.loads(line.decode("utf-8"))
                done[d["key"]] = d
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by the crash we are resuming from (or garbled)
    return done


# ---------------------------------------------------------------------------------------------
# The command


async def prepare_tasks(cfg: TasksConfig, sandbox: SandboxConfig, out_dir: str, display: Display) -> dict:
    """Generate and import the tasks, validate each in a sandbox, and write the suite to `out_dir`."""
    t0 = time.monotonic()
    tasks, dropped = generate_builtin(cfg) if cfg.builtin else ([], [])
    skipped_imports, reasons = [], Counter("dropped: duplicate" for _ in dropped)
    harbor_fields: dict = {}  # what the imported tasks set that runs without effect here, and their networks
    if cfg.harbor_dir:
        from obsspec.env.harbor import import_harbor

        report = import_harbor(cfg.harbor_dir, semantics=cfg.harbor_semantics)
        tasks += report.tasks
        skipped_imports = [{"task": name, "reason": why, "kind": report.kinds[name]} for name, why in report.skipped]
        reasons.update({f"skipped: {kind}": n for kind, n in report.counts().items()})
        harbor_fields = {"fields_not_supported": dict(report.unsupported.most_common()),
                         "network": dict(report.network.most_common())}
    t_gen = time.monotonic() - t0
    if sandbox.isolation == "bwrap":
        await preflight(sandbox)
    os.makedirs(out_dir, exist_ok=True)
    checkpoint = os.path.join(out_dir, "validation.partial.jsonl")
    validations = await validate_all(tasks, sandbox, cfg.workers, cfg.determinism_check,
                                     display, checkpoint, cfg.cheat_audit)
    audited = [v for v in validations if v.cheats is not None]
    valid = [v for v in validations if not v.problem]
    dropped += [{"task_id": v.task.task_id, "reason": v.problem, "kind": v.kind} for v in validations if v.problem]
    reasons.update(f"dropped: {v.kind}" for v in validations if v.problem)
    train, val = split([v.task for v in valid], cfg.val_fraction, cfg.seed)

    files = {
        "train.jsonl": _jsonl(t.to_dict() for t in train),
        "val.jsonl": _jsonl(t.to_dict() for t in val),
        "trajectories.jsonl": _jsonl(
            {**v.reference.to_dict(), "family": v.task.family, "instruction": v.task.instruction,
             "split": "val" if v.task in val else "train"}
            for v in sorted(valid, key=lambda v: v.task.task_id)),
    }
    compared = sum(len(v.repeat.steps) for v in valid if v.repeat)
    differing = [d for v in valid for d in v.differing]
    files["determinism.json"] = _json({
        "commands_compared": compared,
        "identical_fraction": (compared - len(differing)) / compared if compared else None,
        "differing": differing,
    })
    families = Counter(t.family for t in train + val)
    manifest = {
        "tasks": suite_settings(cfg), "seed": cfg.seed, "counts": {"train": len(train), "val": len(val), "dropped": len(dropped)},
        "families": dict(sorted(families.items())),
        # which semantics the suite's tasks run with (obsspec/env/semantics.py), and what each
        # class of skip (import) and drop (validation) reason cost
        "semantics": dict(sorted(Counter(t.semantics or ISOLATED for t in train + val).items())),
        "reasons": dict(reasons.most_common()),
        "dropped": dropped, "skipped_imports": skipped_imports, **({"harbor": harbor_fields} if harbor_fields else {}),
        # imported tasks a cheap cheat passes (dropped, or kept with `cheat_audit: flag`), and by check
        "cheats": {"audited": len(audited), "passed_by_a_cheat": sum(bool(v.cheats) for v in audited),
                   "dropped": sum(v.kind == "cheat-passes" for v in audited),
                   "flagged": sum(bool(v.cheats) and v.kind != "cheat-passes" for v in audited),
                   "by_check": dict(sorted(Counter(c for v in audited for c in v.cheats or []).items())),
                   "tasks": {v.task.task_id: v.cheats for v in audited if v.cheats}},
        "sha256": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in files.items()},
    }
    files["manifest.json"] = _json(manifest)
    write_blobs(out_dir, train + val)  # before the lines that name them
    for name, text in files.items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)
    latencies = sorted(s.seconds for v in valid for s in v.reference.steps)
    summary = {
        "command": "prepare-tasks", "out_dir": out_dir,
        "train": len(train), "val": len(val), "dropped": len(dropped),
        "skipped_imports": len(skipped_imports), "families": len(families), **({"harbor": harbor_fields} if harbor_fields else {}),
        "reasons": dict(reasons.most_common()),
        "cheat_passes_share": (round(sum(bool(v.cheats) for v in audited) / len(audited), 3) if audited else None),
        "determinism_identical_fraction": json.loads(files["determinism.json"])["identical_fraction"],
        "commands_differing": len(differing),
        "generate_sec": round(t_gen, 3), "total_sec": round(time.monotonic() - t0, 3),
        "tool_latency_median_ms": round(1000 * latencies[len(latencies) // 2], 2) if latencies else None,
    }
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        f.write(_json(summary))
    if os.path.exists(checkpoint):
        os.remove(checkpoint)  # complete: nothing left to resume
    return summary


BLOBS = "blobs"  # a suite's folder of the tasks' binary files, each named by its sha256


def write_blobs(out_dir: str, tasks: list[Task]) -> int:
    """Copy every blob of `tasks` into out_dir/blobs/ (once per content, checked against its
    hash as it is read); returns how many were written."""
    folder, written = os.path.join(out_dir, BLOBS), 0
    for blob in {b.sha256: b for task in tasks for b in task.blobs}.values():
        target = os.path.join(folder, blob.sha256)
        if os.path.isfile(target) and os.path.getsize(target) == blob.size:
            continue
        os.makedirs(folder, exist_ok=True)
        with open(target + ".partial", "wb") as f:
            f.write(blob.read())
        os.replace(target + ".partial", target)
        written += 1
    return written


def _jsonl(rows) -> str:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n" for r in rows)


def _json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load_tasks(path: str) -> list[Task]:
    """Tasks from a prepared suite directory (train + val) or a single JSONL file."""
    paths = [path] if os.path.isfile(path) else [
        os.path.join(path, n) for n in ("train.jsonl", "val.jsonl") if os.path.exists(os.path.join(path, n))]
    if not paths:
        raise TaskNotFound(f"{path}: no train.jsonl/val.jsonl here (run `obsspec prepare-tasks` first)")
    tasks = []
    seen: dict[str, str] = {}  # task id -> where it was first
    for p in paths:
        with open(p, "rb") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        task = Task.from_dict(json.loads(line.decode("utf-8")))
                    except ValueError as e:  # json's and utf-8's errors are ValueErrors too
                        raise SuiteError(f"{p}:{number}: not a task: {e}") from None
                    if task.blobs:  # (its binary files: in the suite's blobs/, by sha256)
                        blobs = os.path.join(os.path.dirname(os.path.abspath(p)), BLOBS)
                        task = task.with_blobs_in(blobs)
                        missing = [b.sha256[:12] for b in task.blobs if not os.path.isfile(b.path)]
                        if missing:
                            raise SuiteError(f"{p}:{number}: task {task.task_id} names files missing from "
                                             f"{blobs} ({', '.join(missing)}): copy the suite whole")
                    if task.task_id in seen:
                        raise SuiteError(f"{p}:{number}: task id {task.task_id} is also at "
                                         f"{seen[task.task_id]}: ids name one task each")
                    seen[task.task_id] = f"{p}:{number}"
                    tasks.append(task)
    return tasks


def spread(tasks: list, n: int) -> list:
    """`n` tasks (or rows) taken evenly over `tasks` (a suite's files are grouped by family, so
    the first `n` would all be one family); with n > len(tasks) it wraps around."""
    if not tasks:
        return []
    if n > len(tasks):
        return [tasks[i % len(tasks)] for i in range(n)]
    return [tasks[i * len(tasks) // n] for i in range(n)]


def interleave(tasks: list[Task], seed: int) -> list[Task]:
    """The tasks in a seeded order where every (family, kind) is spread evenly over the whole
    list, in proportion to its size: any stretch of a training run sees the suite's mix, so the
    reward curve follows the policy, not which questions a step happened to draw (a plain shuffle
    can hand one third of a short run most of the hard kind)."""
    rng = random.Random(seed)
    strata: dict[tuple[str, str], list[Task]] = {}
    for task in tasks:
        strata.setdefault((task.family, task.kind), []).append(task)
    keyed = []
    for _, members in sorted(strata.items()):
        rng.shuffle(members)
        offset = rng.random()
        keyed += [((i + offset) / len(members), rng.random(), task) for i, task in enumerate(members)]
    return [task for *_, task in sorted(keyed, key=lambda k: k[:2])]
