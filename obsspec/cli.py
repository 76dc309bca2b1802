"""The `obsspec` command line: parse, load the typed recipe, call one library function.

    obsspec prepare-tasks recipes/tiny-cpu.yaml tasks.num_instances=200 --out runs/tasks
    obsspec shell find-by-name-00003 -c 'ls -la'
    obsspec validate recipes/tiny-cpu.yaml
    obsspec demo

Errors a user can cause (recipe, task id, task folder, missing bubblewrap) print one line and
exit with code 2; anything else is our bug and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from typing import List, Optional

import typer

from obsspec.config import ConfigError, Recipe, explain, load_recipe, to_dict

app = typer.Typer(
    name="obsspec", no_args_is_help=True, add_completion=False, rich_markup_mode="markdown",
    pretty_exceptions_show_locals=False,
    help="Observation speculation for agentic RL on terminal tasks: lossless, faster rollouts.",
)

RECIPE_HELP = "Recipe YAML file (default: the built-in defaults)."
OVERRIDES_HELP = "Recipe overrides as dot.path=value (e.g. `sandbox.timeout_s=5`); `~key` resets a key."
DEMO_INSTANCES = 220
DISPLAY_HELP = "Progress display: auto (rich on a terminal, plain otherwise), rich, plain or none."


def user_errors(fn):
    """Turn the errors a user can cause into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from obsspec.env.harbor import HarborImportError
        from obsspec.env.sandbox import SandboxUnavailable
        from obsspec.env.suite import TaskNotFound
        from obsspec.rollout.run import RolloutError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, TaskNotFound, HarborImportError, SandboxUnavailable, RolloutError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2)

    return wrapper


def _split_recipe(recipe: Optional[str], overrides: List[str]) -> tuple[Optional[str], List[str]]:
    # `obsspec CMD a.b=1` (no recipe file) is allowed: the first argument is then an override.
    if recipe is not None and ("=" in recipe or recipe.startswith("~")) and not os.path.exists(recipe):
        return None, [recipe, *overrides]
    return recipe, list(overrides)


def _load(recipe: Optional[str], overrides: List[str]) -> Recipe:
    return load_recipe(*_split_recipe(recipe, overrides))


def _display(kind: str):
    from obsspec.ui.display import make_display

    if kind not in ("auto", "rich", "plain", "none"):
        raise ConfigError(f"--display must be auto, rich, plain or none, not {kind!r}")
    return make_display(kind)


def _print_summary(summary: dict) -> None:
    typer.echo(json.dumps(summary, indent=2, sort_keys=True))


# ---------------------------------------------------------------------------------------------


@app.command("prepare-tasks")
@user_errors
def prepare_tasks_cmd(
    recipe: Optional[str] = typer.Argument(None, help=RECIPE_HELP),
    overrides: List[str] = typer.Argument(None, help=OVERRIDES_HELP),
    out: str = typer.Option("", "--out", help="Output directory (default: RUN_DIR/tasks)."),
    from_dir: str = typer.Option("", "--from", help="Import a Harbor-layout task folder (or a folder of them)."),
    no_builtin: bool = typer.Option(False, "--no-builtin", help="Only the imported tasks, no built-in families."),
    display: str = typer.Option("auto", "--display", help=DISPLAY_HELP),
):
    """Generate and validate a task suite; write train/val JSONL, reference trajectories, a manifest.

    Every instance is run in the sandbox: its reference solution must pass the verifier and a
    do-nothing episode must fail it; invalid instances are dropped and listed in manifest.json.

    **Examples**

        obsspec prepare-tasks recipes/tiny-cpu.yaml tasks.num_instances=200 --out runs/tasks

        obsspec prepare-tasks --from tasks/harbor-examples --no-builtin --out runs/harbor
    """
    from obsspec.env.suite import prepare_tasks

    extra = [f"tasks.harbor_dir={from_dir}"] if from_dir else []
    extra += ["tasks.builtin=false"] if no_builtin else []
    rec = _load(recipe, (overrides or []) + extra)
    out_dir = out or os.path.join(rec.run_dir, "tasks")
    summary = asyncio.run(prepare_tasks(rec, out_dir, _display(display)))
    _print_summary(summary)


@app.command("shell")
@user_errors
def shell_cmd(
    task_id: str = typer.Argument(..., help="A task id, e.g. find-by-name-00003 (built-in) or one from --tasks."),
    command: List[str] = typer.Option(None, "-c", "--command", help="Run this command (repeatable) instead of reading stdin."),
    solution: bool = typer.Option(False, "--solution", help="Run the task's reference solution."),
    tasks: str = typer.Option("", "--tasks", help="A prepared suite directory (or JSONL) to look the task up in."),
    recipe: Optional[str] = typer.Option(None, "--recipe", help=RECIPE_HELP),
    overrides: List[str] = typer.Option(None, "--set", help=OVERRIDES_HELP),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the verifier at the end."),
    out: str = typer.Option("", "--out", help="Where summary.json goes (default: RUN_DIR/shell/TASK_ID)."),
):
    """Open a task's sandbox and show each observation exactly as the agent would see it.

    Without -c, commands are read from stdin, one per line (Ctrl-D ends the session); the
    verifier then runs and prints the reward.

    **Examples**

        obsspec shell find-by-name-00003 -c 'ls -la' -c 'cat notes.txt'

        obsspec shell csv-filter-00001 --solution
    """
    from obsspec.env.shell import find_task, run_shell

    rec = _load(recipe, overrides or [])
    task = find_task(task_id, tasks or None, rec.tasks.seed)
    commands = list(task.solution) if solution else (list(command) if command else None)
    summary = run_shell(task, rec.sandbox, commands, verify=not no_verify)
    out_dir = out or os.path.join(rec.run_dir, "shell", task.task_id)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"command": "shell", **summary}, f, indent=2, sort_keys=True)


@app.command("rollout")
@user_errors
def rollout_cmd(
    recipe: Optional[str] = typer.Argument(None, help=RECIPE_HELP),
    overrides: List[str] = typer.Argument(None, help=OVERRIDES_HELP),
    mode: str = typer.Option("", "--mode", help="sequential | speculative | both (default: rollout.mode)."),
    replay: str = typer.Option("", "--replay", help="A rollout run directory: answer from its recorded "
                                                    "observations and latencies instead of running tools."),
    out: str = typer.Option("", "--out", help="Output directory (default: RUN_DIR/rollout)."),
    display: str = typer.Option("auto", "--display", help=DISPLAY_HELP),
):
    """Run a batch of terminal episodes with and/or without observation speculation.

    `both` runs the two modes on the same tasks and seeds and prints a side-by-side table:
    latency p50/p95, mean reduction, hit rate, exec_won, rollbacks, wasted tokens, and whether
    the two were token-identical (also in summary.json). Events go to trace-*.jsonl, and
    trace.json opens in Perfetto (ui.perfetto.dev) as a timeline.

    **Examples**

        obsspec rollout recipes/tiny-cpu.yaml --mode both

        obsspec rollout recipes/tiny-cpu.yaml rollout.predictor=history rollout.latency.kind=fixed rollout.latency.median_s=1

        obsspec rollout recipes/tiny-cpu.yaml --replay runs/rollout rollout.predictor=oracle --out runs/replay
    """
    from obsspec.rollout.run import run_rollout
    from obsspec.ui.live import make_live
    from obsspec.ui.tables import print_rollout_table

    rec = _load(recipe, (overrides or []) + ([f"rollout.mode={mode}"] if mode else []))
    out_dir = out or os.path.join(rec.run_dir, "rollout")
    if replay and os.path.abspath(replay) == os.path.abspath(out_dir):
        raise ConfigError("--replay and --out must differ (the replay reads that directory)")
    live_kind = "none" if display == "none" else display
    summary = run_rollout(rec, out_dir, rec.rollout.mode, replay, make_live(live_kind), _display(display))
    print_rollout_table(summary)


@app.command("validate")
@user_errors
def validate_cmd(
    recipe: List[str] = typer.Argument(None, help="Recipe files to check (overrides may follow each)."),
    explain_fields: bool = typer.Option(False, "--explain", help="List every recipe key with its default and meaning."),
):
    """Check recipes (keys, types, cross-field rules) without running anything.

    **Examples**

        obsspec validate recipes/*.yaml

        obsspec validate recipes/tiny-cpu.yaml sandbox.timeout_s=5

        obsspec validate --explain
    """
    if explain_fields:
        for key, default, text in explain():
            typer.echo(f"{key:28} {default:14} {text}")
        return
    files = [r for r in recipe or [] if "=" not in r and not r.startswith("~")]
    overrides = [r for r in recipe or [] if r not in files]
    for path in files or [None]:
        rec = load_recipe(path, overrides)
        typer.echo(f"ok: {path or 'defaults'} ({rec.name})")


@app.command("demo")
@user_errors
def demo_cmd(
    recipe: Optional[str] = typer.Argument(None, help=RECIPE_HELP + " Default: recipes/tiny-cpu.yaml when present."),
    overrides: List[str] = typer.Argument(None, help=OVERRIDES_HELP),
    out: str = typer.Option("", "--out", help="Output directory (default: RUN_DIR/demo)."),
    display: str = typer.Option("auto", "--display", help=DISPLAY_HELP),
):
    """The main job on the embedded default, end to end (what `make demo` runs).

    Prepares a small built-in task suite in the sandbox, then plays one task's reference
    solution turn by turn as the agent would see it, and its verifier reward.

    **Examples**

        obsspec demo

        obsspec demo recipes/tiny-cpu.yaml tasks.num_instances=22
    """
    from obsspec.demo import run_demo

    recipe, overrides = _split_recipe(recipe, overrides or [])
    if recipe is None and os.path.exists("recipes/tiny-cpu.yaml"):
        recipe = "recipes/tiny-cpu.yaml"
    # a small suite keeps the demo to a minute or two; any override given still wins
    rec = load_recipe(recipe, [f"tasks.num_instances={DEMO_INSTANCES}", *overrides])
    typer.echo(f"recipe: {recipe or 'defaults'}", err=True)
    out_dir = out or os.path.join(rec.run_dir, "demo")
    run_demo(rec, out_dir, _display(display))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
