"""The `obsspec` command line: parse, load the typed recipe, call one library function.

    obsspec prepare-tasks recipes/tiny-cpu.yaml tasks.num_instances=200 --out runs/tasks
    obsspec shell find-by-name-00003 -c 'ls -la'
    obsspec validate recipes/tiny-cpu.yaml
    obsspec build-bases recipes/tiny-cpu-bases.yaml
    obsspec serve recipes/tiny-cpu-vllm.yaml
    obsspec train-worldmodel recipes/tiny-cpu.yaml --data runs/tasks --data runs/rollout
    obsspec export runs/train-tiny-cpu --out runs/exported
    obsspec demo
    obsspec report runs/rollout
    obsspec simulate --preset h100-8b --grid tool.median_s=1,3,10

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

from obsspec.config import ConfigError, Recipe, explain, load_recipe, to_dict, user_keys

app = typer.Typer(
    name="obsspec", no_args_is_help=True, add_completion=False, rich_markup_mode="markdown",
    pretty_exceptions_show_locals=False,
    help="Observation speculation for agentic RL on terminal tasks: lossless, faster rollouts.",
)

RECIPE_HELP = "Recipe YAML file (default: the built-in defaults)."
OVERRIDES_HELP = "Recipe overrides as dot.path=value (e.g. `sandbox.timeout_s=5`); `~key` resets a key."
DISPLAY_HELP = "Progress display: auto (rich on a terminal, plain otherwise), rich, plain or none."


def user_errors(fn):
    """Turn the errors a user can cause into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from obsspec.engines.server import ServerError
        from obsspec.env.harbor import HarborImportError
        from obsspec.env.ray_sandbox import RayClusterLost
        from obsspec.env.sandbox import SandboxUnavailable
        from obsspec.env.suite import SuiteError
        from obsspec.models.bases import BasesError
        from obsspec.report.load import ReportError
        from obsspec.build import RolloutError
        from obsspec.sim.config import SimError
        from obsspec.training.grpo import TrainError
        from obsspec.worldmodel.config import WorldModelError
        from obsspec.export import ExportError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, SuiteError, BasesError, HarborImportError, SandboxUnavailable, RolloutError,
                ReportError, SimError, TrainError, WorldModelError, ServerError, RayClusterLost,
                ExportError) as e:
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
    from obsspec.progress import make_display

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

    # quoted: overrides are YAML, and a folder named 0x10 or "a #1" must stay that name
    extra = [f"tasks.harbor_dir={json.dumps(from_dir)}"] if from_dir else []
    extra += ["tasks.builtin=false"] if no_builtin else []
    rec = _load(recipe, (overrides or []) + extra)
    out_dir = out or os.path.join(rec.run_dir, "tasks")
    summary = asyncio.run(prepare_tasks(rec.tasks, rec.sandbox, out_dir, _display(display)))
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

    `both` runs the two modes on the same tasks and seeds, `rollout.pairs` times with the order
    alternating, and prints a side-by-side table: latency p50/p95, hit rate, exec_won,
    rollbacks, speculation skipped (and why), committed work delayed by speculation, wasted
    tokens, whether every pass was token-identical, and the mean latency reduction with its
    95 % interval over the pairs ("not resolvable here" when it includes 0). All of it is in
    summary.json. Events go to trace-*.jsonl, and trace.json opens in Perfetto
    (ui.perfetto.dev) as a timeline.

    **Examples**

        obsspec rollout recipes/tiny-cpu.yaml --mode both

        obsspec rollout recipes/tiny-cpu.yaml rollout.predictor=history rollout.latency.kind=fixed rollout.latency.median_s=1

        obsspec rollout recipes/tiny-cpu.yaml --replay runs/rollout rollout.predictor=oracle --out runs/replay
    """
    from obsspec.rollout_run import run_rollout
    from obsspec.ui.live import make_live
    from obsspec.ui.tables import print_rollout_table

    rec = _load(recipe, (overrides or []) + ([f"rollout.mode={mode}"] if mode else []))
    out_dir = out or os.path.join(rec.run_dir, "rollout")
    if replay and os.path.abspath(replay) == os.path.abspath(out_dir):
        raise ConfigError("--replay and --out must differ (the replay reads that directory)")
    progress = _display(display)  # (checks --display before anything starts)
    summary = run_rollout(rec, out_dir, rec.rollout.mode, replay, make_live(display), progress)
    print_rollout_table(summary)


@app.command("train")
@user_errors
def train_cmd(
    recipe: Optional[str] = typer.Argument(None, help=RECIPE_HELP),
    overrides: List[str] = typer.Argument(None, help=OVERRIDES_HELP),
    out: str = typer.Option("", "--out", help="Run directory (default: RUN_DIR/train-NAME)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its last checkpoint."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the recipe and print the plan (where each "
                                                          "process runs, each GPU's memory); load no model."),
    gpus: int = typer.Option(0, "--gpus", help="With --dry-run: plan for a node of this many GPUs (default: "
                                               "this machine's, when it has any)."),
    gpu_memory_gb: float = typer.Option(0.0, "--gpu-memory-gb", help="With --gpus: memory of each GPU, GB "
                                                                     "(80 for an H100/A100 80GB, 141 for an H200)."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON."),
    display: str = typer.Option("auto", "--display", help=DISPLAY_HELP),
):
    """GRPO training of the policy with speculative rollouts and world-model co-training.

    Each step: `train.tasks_per_step` train tasks x `train.group_size` episodes run at once in
    real sandboxes, with observation speculation (lossless: the tokens are the sequential
    ones); TRL's GRPOTrainer updates the policy on them; the world model's LoRA adapter is
    trained on the step's real observations and swapped in before the next step. The live
    display shows the hit rate and the rollout time speculation hid. Writes metrics.jsonl
    (`obsspec report RUN_DIR` plots it), eval.json (val success before and after), checkpoints.

    On GPUs every start first plans the node (docs/PLACEMENT.md): which
    GPUs the trainer's processes, the vLLM servers and the world model's co-training use
    (`servers.*_gpus`), and an estimate of each GPU's memory from the models' shapes. A layout
    that cannot fit stops with one line naming what overflows, by how much and the key to
    change. `--dry-run` prints that plan on any machine; `--gpus` and `--gpu-memory-gb` give it
    a node to plan for.

    **Examples**

        obsspec train recipes/tiny-cpu.yaml

        obsspec train recipes/tiny-cpu.yaml train.steps=10 --out runs/short

        obsspec train recipes/tiny-cpu.yaml --out runs/short --resume

        obsspec train recipes/terminal-8b.yaml --dry-run --gpus 8 --gpu-memory-gb 80

        obsspec train recipes/terminal-8b.yaml --dry-run --gpus 8 --gpu-memory-gb 80 train.micro_batch_size=4

        torchrun --nproc_per_node 2 -m obsspec train recipes/tiny-cpu.yaml
    """
    from obsspec.training.grpo import dry_run_plan, run_training
    from obsspec.training.plan import PlanError
    from obsspec.ui.live import make_live

    rec = _load(recipe, overrides or [])
    out_dir = out or os.path.join(rec.run_dir, f"train-{rec.name}")
    if dry_run:
        try:
            plan, text = dry_run_plan(rec, gpus, gpu_memory_gb)
        except PlanError as e:
            if e.text and not as_json:
                typer.echo(e.text)
            raise
        typer.echo(json.dumps({"command": "train", "dry_run": True, "out_dir": out_dir, **plan}, indent=2)
                   if as_json else text)
        return
    if gpus or gpu_memory_gb or as_json:
        raise ConfigError("--gpus, --gpu-memory-gb and --json go with --dry-run (a start plans the GPUs it finds)")
    progress = _display(display)  # (checks --display before anything starts)
    summary = run_training(rec, out_dir, resume=resume, live=make_live(display, "training"),
                           display=progress)
    if summary:
        from obsspec.ui.tables import print_training_table

        print_training_table(summary, rec.rollout.latency)
@app.command("export")
@user_errors
def export_cmd(
    run_dir: str = typer.Argument(..., help="A training run's folder (`obsspec train --out`)."),
    out: str = typer.Option("", "--out", help="Where the export goes, a new folder (default: RUN/export/step-N)."),
    step: Optional[int] = typer.Option(None, "--step", help="Export the checkpoint of this step."),
    best: bool = typer.Option(False, "--best", help="Export the checkpoint of highest measured val success "
                                                    "(`train.eval_checkpoints=true` measures every one)."),
    adapters: bool = typer.Option(False, "--adapters", help="Also write the LoRA adapters alone "
                                                            "(policy-lora/, world_model-lora/)."),
    device: str = typer.Option("cpu", "--device", help="Where the merge runs: cpu or cuda."),
):
    """Write a run's trained policy and world model as model folders that load and serve as they are.

    Takes the newest complete checkpoint (a run that was killed: says which one), `--step N`, or
    `--best`. OUT/policy/ is the policy with its LoRA merged into the base, in the base's dtype,
    with the tokenizer and chat template: `AutoModelForCausalLM.from_pretrained`, `vllm serve`
    and `policy.model=OUT/policy` load it. OUT/world_model/ is the world model that checkpoint's
    rollouts would have used, merged the same way. OUT/README.md is the model card (recipe, step,
    val figures, speculation's figures); OUT/obsspec.json holds the command and commit.

    **Examples**

        obsspec export runs/train-tiny-cpu --out runs/exported

        obsspec export runs/train-tiny-cpu --best --adapters --out runs/best

        obsspec export runs/train-terminal-8b --step 200 --device cuda --out /data/terminal-8b-step200

        vllm serve runs/exported/policy
    """
    from obsspec.export.run import export_run

    summary = export_run(run_dir, out, step, best, adapters, device,
                         command=" ".join(["obsspec", *sys.argv[1:]]), log=lambda s: typer.echo(s, err=True))
    typer.echo(f"wrote {summary['out']}: README.md, obsspec.json, "
               + ", ".join(f"{m['folder']}/" for m in (summary["policy"], summary["world_model"]) if m.get("folder"))
               + f" ({summary['seconds']:.1f} s)")


@app.command("train-worldmodel")
@user_errors
def train_worldmodel_cmd(
    recipe: Optional[str] = typer.Argument(None, help=RECIPE_HELP),
    overrides: List[str] = typer.Argument(None, help=OVERRIDES_HELP),
    data: List[str] = typer.Option(None, "--data", help="A data source (task suite, rollout or train "
                                                        "run directory, trajectories JSONL); repeatable."),
    eval_only: str = typer.Option("", "--eval-only", help="Only evaluate this adapter (a folder, a run "
                                                          "directory = its latest version, DIR@N, or 'base')."),
    eval_on: List[str] = typer.Option(None, "--eval-on", help="Evaluate on the held-out part of these "
                                                              "sources instead (repeatable)."),
    out: str = typer.Option("", "--out", help="Run directory (default: RUN_DIR/world_model)."),
    display: str = typer.Option("auto", "--display", help=DISPLAY_HELP),
):
    """Fine-tune a LoRA adapter for the world model on recorded episodes and publish it as a new version.

    Training rows are the world model's rollout context with the observation as target (loss on
    observation tokens only); task instances are split into train and held-out. The new version
    lands atomically in OUT/adapters/ (`latest` points at it) and is evaluated against its base
    on the held-out steps: exact-match hit rate overall and per command class, unusable drafts,
    draft latency against the tool's. `obsspec rollout world_model.adapter=OUT` serves it.

    **Examples**

        obsspec train-worldmodel recipes/tiny-cpu.yaml --data runs/tasks --data runs/rollout

        obsspec train-worldmodel recipes/tiny-cpu.yaml --eval-only runs/world_model --eval-on runs/rollout

        obsspec train-worldmodel recipes/tiny-cpu.yaml wm_train.max_steps=50 wm_train.init_adapter=runs/world_model --data runs/rollout
    """
    from obsspec.worldmodel.evaluate import table
    from obsspec.worldmodel.run import run_train_worldmodel

    rec = _load(recipe, overrides or [])
    out_dir = out or os.path.join(rec.run_dir, "world_model")
    summary = run_train_worldmodel(rec, out_dir, list(data or []), eval_only, list(eval_on or []),
                                   _display(display))
    typer.echo(table(summary))


@app.command("build-bases")
@user_errors
def build_bases_cmd(
    recipe: str = typer.Argument(..., help="Recipe whose tasks, kit and policy sections say what to build."),
    overrides: List[str] = typer.Argument(None, help=OVERRIDES_HELP),
    out: str = typer.Option("", "--out", help="Where the bases go (default: the recipe's kit.bases)."),
    work: str = typer.Option("", "--work", help="Working folder: suite, stage outputs, checkpoints "
                                                "(default: .cache/bases/NAME). Keep it to resume."),
    display: str = typer.Option("auto", "--display", help=DISPLAY_HELP),
):
    """Build the pretrained tiny bases (tokenizer, policy, world model) once, long, and evaluate them.

    Prepares the recipe's task suite, builds its kit (`kit.*`: the same stages as the quick kit
    every tiny recipe builds, with the recipe's budgets) saving checkpoints as it goes, evaluates
    both models on the val split (policy success per family, world-model exact hits per command
    class) and writes them with a manifest (command, inputs and their sha256, quality, machine)
    to OUT. Killed at any point, the same command resumes from WORK. Recipes whose `kit.bases`
    names OUT then start from these models when their suite is the one they were built for.

    **Examples**

        obsspec build-bases recipes/tiny-cpu-bases.yaml

        obsspec build-bases recipes/tiny-cpu-bases.yaml --out /tmp/my-bases kit.policy.max_steps=100
    """
    from obsspec.models.bases import bases_dir
    from obsspec.models.bases_build import build_bases

    rec = _load(recipe, overrides or [])
    target = out or (bases_dir(rec.kit.bases) if rec.kit.bases else "")
    if not target:
        raise ConfigError("build-bases: say where the bases go: --out DIR or kit.bases in the recipe")
    command = " ".join(["obsspec build-bases", recipe, *(overrides or []),
                        *(["--out", out] if out else []), *(["--work", work] if work else [])])
    manifest = build_bases(rec, target, work or os.path.join(".cache", "bases", rec.name), _display(display),
                           command)
    _print_summary({"out": target, "build_sec": manifest["build_sec"], "models": manifest["models"],
                    "quality": manifest["quality"]})


@app.command("serve")
@user_errors
def serve_cmd(
    recipe: str = typer.Argument(..., help="Recipe whose policy / world_model sections use engine vllm."),
    overrides: List[str] = typer.Argument(None, help=OVERRIDES_HELP),
    print_only: bool = typer.Option(False, "--print", help="Print the servers' command lines and exit."),
    logs: str = typer.Option("", "--logs", help="Folder for the servers' logs (default: RUN_DIR/servers)."),
    display: str = typer.Option("auto", "--display", help=DISPLAY_HELP),
):
    """Start the vLLM servers a recipe needs, wait until they serve, and keep them until Ctrl-C.

    One server per section on `engine: vllm`, on its `server_url`'s port, with the flags its
    rollouts and training need (LoRA loading at run time, the sampled distribution's logprobs,
    the context length, the trainer's dtype; on CPU one core each): obsspec/engines/server.py
    says what each is for. `--print` shows the exact lines (what to run on a GPU machine by
    hand). With `servers.launch: true` in the recipe, `obsspec rollout` and `obsspec train` start
    and stop them themselves. A `tiny` model is resolved to its kit first.

    **Examples**

        obsspec serve recipes/tiny-cpu-vllm.yaml

        obsspec serve recipes/terminal-8b.yaml --print
    """
    import time

    from obsspec.build import model_paths, server_specs_for
    from obsspec.engines.server import Servers

    rec = _load(recipe, overrides or [])
    if "vllm" not in (rec.policy.engine, rec.world_model.engine):  # (before a kit is built for nothing)
        raise ConfigError("serve: no section of this recipe uses engine vllm (policy.engine, world_model.engine)")
    progress = _display(display)
    specs = server_specs_for(rec, *model_paths(rec, progress))
    if print_only:
        for spec in specs:
            typer.echo(f"# {spec.role}\n{spec.shell()}")
        return
    with Servers(specs, logs or os.path.join(rec.run_dir, "servers"), progress):
        typer.echo("serving: " + ", ".join(f"{s.role} {s.url}" for s in specs) + " (Ctrl-C stops them)")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            typer.echo("stopping the servers")


@app.command("validate")
@user_errors
def validate_cmd(
    recipe: List[str] = typer.Argument(None, help="Recipe files to check (overrides may follow each)."),
    explain_fields: bool = typer.Option(False, "--explain", help="List the recipe keys a user sets, with their "
                                                                 "defaults and meanings."),
    kit_fields: bool = typer.Option(False, "--kit", help="With --explain: list the kit.* keys that build the tiny "
                                                         "models instead (obsspec build-bases)."),
):
    """Check recipes (keys, types, cross-field rules, what training needs) without running anything.

    **Examples**

        obsspec validate recipes/*.yaml

        obsspec validate recipes/tiny-cpu.yaml sandbox.timeout_s=5

        obsspec validate --explain

        obsspec validate --explain --kit
    """
    if explain_fields:
        rows, building = user_keys(), [r for r in explain() if r not in user_keys()]
        for key, default, text in building if kit_fields else rows:
            typer.echo(f"{key:28} {default:14} {text}")
        if not kit_fields:
            typer.echo(f"\n# and {len(building)} kit.* keys that build the tiny models of the embedded default "
                       "(shapes, budgets, extra data; docs/MODELS.md): obsspec validate --explain --kit")
        return
    files = [r for r in recipe or [] if "=" not in r and not r.startswith("~")]
    overrides = [r for r in recipe or [] if r not in files]
    for path in files or [None]:
        rec = load_recipe(path, overrides)
        if rec.kit.bases:  # a missing or half-written bases folder: now, not at the first rollout
            from obsspec.models.bases import bases_dir, read_manifest

            read_manifest(bases_dir(rec.kit.bases))
        try:
            rec.check_training()  # (one process; under torchrun, `train --dry-run` checks the split)
        except ValueError as e:
            raise ConfigError(f"{path or 'defaults'}: `obsspec train` cannot run it: {e}") from None
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

    Prepares the built-in task suite in the sandbox, plays one task's reference solution turn
    by turn as the agent would see it (and its verifier reward), then trains: `obsspec train`
    on the recipe — it builds the tiny model kit on first use — with the live display (hit
    rate, rollout time hidden by speculation), val success before and after, and a table.

    **Examples**

        obsspec demo

        obsspec demo recipes/tiny-cpu.yaml train.steps=5
    """
    from obsspec.demo import run_demo

    recipe, overrides = _split_recipe(recipe, overrides or [])
    if recipe is None and os.path.exists("recipes/tiny-cpu.yaml"):
        recipe = "recipes/tiny-cpu.yaml"
    rec = load_recipe(recipe, overrides)
    typer.echo(f"recipe: {recipe or 'defaults'}", err=True)
    out_dir = out or os.path.join(rec.run_dir, "demo")
    run_demo(rec, out_dir, _display(display), recipe or "", overrides)


@app.command("report")
@user_errors
def report_cmd(
    run_dir: str = typer.Argument(..., help="A rollout run directory (trace-*.jsonl) or a training run (metrics.jsonl)."),
    out: str = typer.Option("", "--out", help="Output directory (default: RUN_DIR/report)."),
    episodes: int = typer.Option(4, "--episodes", help="Episodes drawn in the timeline."),
):
    """Write an offline HTML report of what speculation did to a run, with PNG plots and a Chrome trace.

    Plots: hit rate (per training step, or over the rollout; overall and per command class),
    latency breakdown per trajectory (generation, tool, world model, overlap, blocked), a
    timeline of a few episodes (speculation kept and cancelled), wasted tokens, and speculative
    against sequential latency. trace.json opens in ui.perfetto.dev.

    **Examples**

        obsspec report runs/rollout

        obsspec report runs/rollout --out /tmp/report --episodes 6
    """
    from obsspec.report.report import write_report

    if episodes < 1:
        raise ConfigError("--episodes must be >= 1")
    _print_summary(write_report(run_dir, out, episodes))


@app.command("simulate")
@user_errors
def simulate_cmd(
    overrides: List[str] = typer.Argument(None, help="Simulator parameters as dot.path=value "
                                                     "(`obsspec simulate --explain` lists them)."),
    grid: List[str] = typer.Option(None, "--grid", help="A swept parameter, key=v1,v2,... (repeatable)."),
    preset: str = typer.Option("", "--preset", help="Start from h100-8b, h100-32b or cpu-tiny (docs/REPORT.md)."),
    from_run: str = typer.Option("", "--from", help="A rollout run (--mode both): its measured latencies, "
                                                    "token counts, hit rates and engine speed; or a Harbor "
                                                    "job (a trial, or a folder of jobs): its agents' "
                                                    "timings, turns and model-free hits (obsspec/sim/job.py)."),
    seeds: int = typer.Option(8, "--seeds", help="With a Harbor job: draws of the world model's hits per point."),
    out: str = typer.Option("", "--out", help="Output directory (default: runs/simulate)."),
    threshold: float = typer.Option(0.02, "--threshold", help="|reduction| below this is 'neutral'."),
    explain_keys: bool = typer.Option(False, "--explain", help="List every simulator key with its default."),
):
    """Simulate a batch of episodes with and without speculation over a grid of regimes.

    A discrete-event model: tool latencies, world-model latency, generation on one shared engine
    of limited throughput (speculative requests compete with committed ones; cancelled work is
    wasted), hit rate (overall or per command class), depth, breadth and concurrency. Prints the
    latency reduction per grid point (helps / neutral / hurts) and plots it. Without --grid and
    --from it sweeps tool latency x hit rate.

    **Examples**

        obsspec simulate --preset h100-8b --grid tool.median_s=1,3,10 --grid spec.hit_rate=0.4,0.6,0.8

        obsspec simulate --preset h100-32b spec.depth=2 --grid tool.median_s=1,2,5

        obsspec simulate --from runs/rollout --grid spec.hit_rate=0,0.5,1

        obsspec simulate --from jobs/2026-04-15__16-35-22 --preset h100-8b --grid workload.concurrency=1,8,32
    """
    from obsspec.sim.config import SimConfig, explain
    from obsspec.sim.presets import preset as load_preset
    from obsspec.sim.simulate import parse_grid, simulate, table

    if explain_keys:
        for key, default, text in explain():
            typer.echo(f"{key:30} {default:12} {text}")
        return
    cfg = load_preset(preset) if preset else SimConfig()
    axes = parse_grid(grid or [])
    from obsspec.sim.job import is_job, job_table, simulate_job

    if from_run and is_job(from_run):
        out_dir = out or os.path.join("runs", "simulate")
        result = simulate_job(cfg, [from_run], axes or parse_grid(["workload.concurrency=1,8,32"]), out_dir,
                              overrides or [], seeds)
        typer.echo(job_table(result))
        typer.echo(f"wrote {os.path.join(out_dir, 'simulate.json')}")
        return
    if not axes and not from_run:
        axes = parse_grid(["tool.median_s=1,3,10", "spec.hit_rate=0.2,0.4,0.6,0.8"])
    out_dir = out or os.path.join("runs", "simulate")
    result = simulate(cfg, axes, from_run, out_dir, overrides or [], threshold)
    typer.echo(table(result))
    if result.get("measured_reduction") is not None:
        typer.echo(f"measured in {from_run}: {100 * result['measured_reduction']:.1f} % latency reduction")
    typer.echo(f"wrote {os.path.join(out_dir, 'simulate.json')}" + (", simulate.png" if axes else ""))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
