"""Test tiers. `make test` runs everything but `gpu`; `make test-fast` (about 75 s on 2 cores)
also leaves out what is marked `slow` here: the CLI end-to-end files, the container and Ray
cases of the backend suites, and every test that took a second or more on 2 cores. Add a test here when `make test`'s slowest list shows it."""

import os
import re

import pytest

SLOW_FILES = {"test_training_cli.py", "test_rollout_cli.py", "test_rollout.py", "test_ray.py", "test_export.py",
              "test_export_models.py", "test_gate_engines.py",
              "test_harbor_semantics.py", "test_harbor_trust.py"}  # (every test starts processes or containers)
SLOW_TESTS = {
    "test_cli.py::test_prepare_tasks_is_reproducible_and_loadable",
    "test_engines.py::test_engine_with_a_prefix_cache_drafts_exactly_as_without",
    "test_engines.py::test_prompt_lookup_keeps_greedy_output_and_takes_fewer_passes",
    "test_faults.py::test_timeout_parameter_is_clamped_and_shown",
    "test_faults.py::test_tool_failure_mid_draft_cancels_the_speculative_actions",
    "test_harbor.py::test_a_verifier_may_run_longer_than_the_sandboxs_default",
    "test_harbor.py::test_the_verifiers_timeout_sec_is_its_time_limit",
    "test_harbor.py::test_hostile_folders_are_one_line_skips_counted_by_kind_and_the_rest_import",
    "test_harbor.py::test_prepare_tasks_drops_or_flags_what_a_cheap_cheat_passes",
    "test_harbor.py::test_the_audit_names_a_verifier_that_runs_the_agents_venv",
    "test_harbor.py::test_reward_json_partial_credit_reaches_the_sandbox",
    "test_kit.py::test_a_micro_policy_learns_to_copy_names_it_never_saw",
    "test_kit.py::test_a_kit_that_differs_in_its_world_model_only_trains_the_world_model_alone",
    "test_kit.py::test_a_kit_that_differs_in_its_sampling_runs_the_rollouts_again_on_the_same_policy",
    "test_kit.py::test_ensure_kit_builds_loadable_models_once_then_uses_the_cache",
    "test_kit.py::test_mistakes_give_the_world_model_and_the_tokenizer_real_error_messages",
    "test_report.py::test_latency_parts_add_up_to_each_episodes_latency",
    "test_report.py::test_page_renders_offline_in_chromium_without_console_errors",
    "test_report.py::test_report_cli",
    "test_report.py::test_the_browser_check_catches_a_broken_page",
    "test_report.py::test_training_run_reads_metrics_jsonl_and_its_last_rollout",
    "test_reward_hacks.py::test_link_chains_deeper_than_path_max_or_through_dev_stdin_are_removed",
    "test_reward_hacks.py::test_many_entries_or_a_lingering_big_process_are_not_infra_errors",
    "test_reward_hacks.py::test_the_loader_and_system_dirs_cannot_be_swapped_under_the_harness",
    "test_rollout_outputs.py::test_replay_reproduces_the_recorded_episodes_without_tools",
    "test_rollout_outputs.py::test_trace_jsonl_and_chrome_export",
    "test_sandbox.py::test_fork_bomb_is_contained_and_the_episode_recovers",
    "test_sandbox.py::test_infinite_loop_times_out",
    "test_sandbox.py::test_timeout_kills_the_command_tree_and_the_episode_continues",
    "test_sandbox.py::test_unsandboxed_mode_only_when_asked_and_warns",
    "test_sandbox_trust.py::test_a_pinned_full_tmpfs_is_tampering_not_an_empty_verifier",
    "test_sandbox_trust.py::test_an_unbounded_harbor_verifier_is_clamped",
    "test_sandbox_trust.py::test_concurrent_sandboxes_cannot_pass_a_number_through_per_user_counters",
    "test_sandbox_trust.py::test_many_links_beside_busy_neighbours_are_scored_not_infra",
    "test_simulate.py::test_from_a_recorded_run",
    "test_simulate.py::test_simulate_cli_writes_json_and_plot",
    "test_simulate.py::test_simulated_reductions_match_the_measured_benchmark_where_docs_say_so",
    "test_snapshot.py::test_a_budget_that_does_not_fit_is_one_line_from_the_cli",
    "test_snapshot.py::test_switch_on_is_lossless_and_rows_cases_and_drafts_agree",
    "test_training.py::test_a_dead_cotraining_worker_is_loud_restarted_and_the_engine_keeps_its_version",
    "test_training.py::test_one_cotraining_worker_trains_every_version_and_a_failed_job_keeps_it_alive",
    "test_worldmodel.py::test_train_worldmodel_trains_publishes_and_evaluates",
    "test_trackers.py::test_wandb_without_the_package_is_one_line_naming_the_install",
    "test_worldmodel.py::test_train_adapter_learns_saves_and_leaves_the_base_as_it_was",
    "test_kit.py::test_a_training_step_changes_every_parameter",
    "test_podman.py::test_harbor_image_tasks_pass_with_their_solution_and_fail_without",
    "test_podman.py::test_the_episode_contract_holds_in_a_container",
    "test_podman.py::test_memory_pids_and_cpu_are_the_containers_limits",
    "test_podman.py::test_the_first_container_of_a_process_removes_those_whose_harness_is_dead",
    "test_podman.py::test_every_builtin_family_validates_in_a_container",
    "test_podman.py::test_speculation_is_lossless_on_container_tasks",
    "test_podman.py::test_memory_the_agents_files_hold_at_verification_scores_zero_never_infra",
    "test_plan.py::test_activation_bytes_are_what_autograd_keeps",
    "test_plan.py::test_a_start_on_gpus_refuses_before_anything_loads",
    "test_scale.py::test_the_scale_benchmark_runs_and_reports_its_figures",
    "test_collectives.py::test_the_others_wait_out_the_main_processs_work_alone",
    "test_retention.py::test_world_model_versions_are_pruned_except_the_serving_and_the_checkpointed",
    "test_wm_rows.py::test_the_tiny_recipes_cotraining_rows_are_what_they_were",
    "test_wm_rows.py::test_micro_batches_accumulate_to_the_batchs_update",
    "test_wm_rows.py::test_the_loss_in_chunks_is_the_loss_and_keeps_no_full_logits",
    "test_vllm_build.py::test_the_build_is_read_from_the_environments_metadata",
    "test_vllm_build.py::test_every_mismatch_is_refused_before_a_server_starts",
    "test_vllm_build.py::test_a_cuda_section_served_by_the_cpu_build_is_one_line",
    "test_gpu_check.py::test_an_out_of_memory_step_is_reported_as_does_not_fit_beside_its_estimate",
    "test_dockerfile.py::test_a_translated_dockerfile_builds_with_buildkits_meaning",
    "test_dockerfile.py::test_without_the_translation_this_podman_cannot_build_a_heredoc",
    "test_cli.py::test_serve_prints_the_servers_command_lines_and_refuses_a_recipe_without_one",
    "test_simulate.py::test_a_recorded_run_has_the_command_classes_of_the_training_metrics",
    "test_simulate.py::test_the_bound_bench_splits_draft_times_by_where_the_draft_came_from",
    "test_simulate.py::test_simulate_user_errors_are_one_line",
    "test_simulate.py::test_help_ends_with_examples",
    "test_bases.py::test_a_killed_build_resumes_from_its_checkpoint_to_the_same_bytes",
    "test_engines.py::test_low_priority_work_waits_for_normal_work_or_rides_in_its_pass",
    "test_podman.py::test_the_verifier_starts_after_every_agent_process_and_reads_its_own_files",
    "test_podman.py::test_the_clock_and_file_times_are_pinned_and_episodes_repeat",
    "test_podman.py::test_no_network_read_only_root_and_bounded_writes",
    "test_podman.py::test_a_failed_build_is_one_line_naming_the_step",
    "test_podman.py::test_closing_leaves_no_container_and_a_killed_one_is_an_infra_error",
    "test_report.py::test_wasted_tokens_and_hits_agree_with_the_rollout_summary",
    "test_report.py::test_report_writes_plots_trace_and_a_self_contained_page",
    "test_snapshot.py::test_the_listing_is_what_the_agents_own_ls_prints_and_contents_are_the_files",
    "test_kit.py::test_the_copy_curriculum_trains_the_world_model_on_copies_first_then_goes_on_from_there",
    "test_kit.py::test_with_the_workspace_snapshot_the_world_model_base_learns_with_it_ahead_of_every_row",
    "test_kit.py::test_the_listing_stage_comes_first_and_the_copies_and_real_rows_go_on_from_its_model",
    "test_config.py::test_hostile_recipe_files_are_one_short_line",
    "test_config.py::test_explain_lists_what_users_set_and_the_kit_apart",
    "test_faults.py::test_cancel_at_every_await_point_of_a_turn_propagates_and_cleans_up",
    "test_faults.py::test_one_failing_draft_request_cancels_its_siblings",
    "test_cli.py::test_validate_refuses_what_train_cannot_run",
    "test_cli.py::test_limits_no_sandbox_can_run_with_are_refused_by_validate",
    "test_cli.py::test_a_mistyped_reset_key_is_refused",
    "test_suite.py::test_a_hand_written_suite_line_of_the_wrong_shape_is_one_line_naming_it",
}


# Tests that load the machine's CPU on purpose (busy neighbours, process and thread fills, busy
# loops) or time one pass against another: `make test` runs them after the others, in one process,
# so that nothing of another worker runs beside them (a container episode beside a busy-neighbours
# test in the other worker was seen to differ once).
SERIAL_FILES = {"test_sandbox_trust.py", "test_harbor_trust.py", "test_gate_engines.py"}
# (a 0.5 s window in which no stopped agent process may write: it once saw a write beside the
# other worker's training tests, a doubt about the freeze under load that stays documented)
SERIAL_TESTS = {"test_harbor_semantics.py::test_without_services_in_its_tests_the_agents_processes_are_stopped_for_the_verifier"}


def pytest_configure(config):
    config.addinivalue_line("markers", "serial: loads the CPU on purpose or times passes against each "
                                       "other: `make test` runs these alone, after the others")


# `make test` and `make test-fast` run two pytest workers (pytest-xdist), which take whole groups: a file's tests
# stay in one worker (its module fixtures are built once), and every test that starts containers or
# uses the Ray cluster runs in one group, so the session's podman base image, its check that no
# container is left behind, and the Ray cluster are one worker's alone. The longest groups go first,
# so that neither worker is left alone with one at the end.
CONTAINER_FILES = {"test_podman.py", "test_dockerfile.py", "test_harbor_semantics.py", "test_harbor_trust.py",
                   "test_ray.py"}
LONGEST_FIRST = ["containers", "test_training_cli.py", "test_vllm_real.py", "test_learning.py", "test_export.py",
                 "test_rollout_cli.py", "test_rollout.py", "test_gpu_check.py", "test_sandbox_trust.py"]


def xdist_group(nodeid: str) -> str:
    file = nodeid.split("::")[0].rsplit("/", 1)[-1]
    if file in CONTAINER_FILES or re.search(r"\[(podman|ray)[-\]]", nodeid):
        return "containers"
    return file


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    config.option.loadscopereorder = False  # (the order below: longest first)
    return ByGroup(config, log)


@pytest.hookimpl(wrapper=True)  # (before -m picks the tier)
def pytest_collection_modifyitems(items):
    for item in items:
        name = f"{item.path.name}::{item.originalname}"
        # (the same suite on containers or on Ray workers: the bubblewrap case stays fast)
        remote = getattr(item, "callspec", None) is not None and item.callspec.params.get("sandbox_backend") in ("podman", "ray")
        if item.path.name in SLOW_FILES or name in SLOW_TESTS or item.get_closest_marker("integration") or remote:
            item.add_marker(pytest.mark.slow)
        if item.path.name in SERIAL_FILES or name in SERIAL_TESTS:
            item.add_marker(pytest.mark.serial)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # (one process keeps the files' order)
        rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(xdist_group(item.nodeid), len(rank)))  # (stable: files stay whole)
    return (yield)


# ---------------------------------------------------------------------------------------------
# Sandbox backends: suites that hold for every backend take `sandbox_backend` (or patch their
# module's config with `on_backend`); podman's base image is built once (about a minute, then
# cached by podman across runs), and no episode container may be left behind by the session.


def podman_missing() -> str:
    """Why podman cannot run here ('' = it can). With OBSSPEC_REQUIRE_PODMAN=1 (`make test`) a
    missing tool is an error: the container tier must not pass by being skipped."""
    import os
    import shutil

    for tool in ("podman", "runc", "mmdebstrap"):
        if shutil.which(tool) is None:
            if os.environ.get("OBSSPEC_REQUIRE_PODMAN") == "1":
                raise RuntimeError(f"OBSSPEC_REQUIRE_PODMAN=1 but {tool} is missing: run `make install-podman`")
            return f"needs {tool} (make install-podman)"
    return ""


@pytest.fixture(scope="session")
def podman_base():
    if podman_missing():
        pytest.skip(podman_missing())
    from obsspec.env import images, podman

    images.ensure_base()
    yield images.BASE_IMAGE
    left = podman.leftover_containers()
    assert not left, f"episode containers left behind: {left}"


# The suites that also run with their sandboxes on Ray workers (backend "ray": bubblewrap there).
RAY_SUITES = {"test_faults.py", "test_reward_hacks.py"}


def pytest_generate_tests(metafunc):
    if "sandbox_backend" in metafunc.fixturenames:
        backends = ["bwrap", "podman"] + (["ray"] if metafunc.module.__file__.endswith(tuple(RAY_SUITES)) else [])
        metafunc.parametrize("sandbox_backend", backends, indirect=True)


@pytest.fixture
def sandbox_backend(request):
    import shutil

    if request.param in ("bwrap", "ray") and shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (make install)")
    if request.param == "podman":
        request.getfixturevalue("podman_base")
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return request.param


def backend_config(config, backend: str):
    """`config` for a backend of the `sandbox_backend` fixture ("ray": bubblewrap on the test's
    Ray cluster)."""
    import dataclasses

    if backend == "ray":
        return dataclasses.replace(config, backend="bwrap", placement="ray",
                                   ray=dataclasses.replace(config.ray, address=RayCluster.address))
    return dataclasses.replace(config, backend=backend)


def on_backend(module, monkeypatch, backend: str) -> None:
    """Every SandboxConfig the test module makes (its CFG-like constants and its calls) uses
    `backend`, and with "ray" every `Sandbox` it opens is one on a Ray worker."""
    from obsspec.env.sandbox import SandboxConfig

    for name, value in vars(module).items():
        if isinstance(value, SandboxConfig):
            monkeypatch.setattr(module, name, backend_config(value, backend))
    monkeypatch.setattr(module, "SandboxConfig", lambda *a, **k: backend_config(SandboxConfig(*a, **k), backend))
    if backend == "ray" and hasattr(module, "Sandbox"):
        from obsspec.env.ray_sandbox import RaySandbox

        monkeypatch.setattr(module, "Sandbox", RaySandbox)


# ---------------------------------------------------------------------------------------------
# A Ray cluster on this machine: a head without CPUs (nothing runs there, as on a trainer node)
# and two worker nodes, started once (~15 s) for the tests that need it and torn down at the end.
# With OBSSPEC_REQUIRE_RAY=1 (`make test`) a missing Ray is an error, not a skip.


class RayCluster:
    address = ""
    cluster = None
    workers: list = []


def ray_missing() -> str:
    import importlib.util
    import os

    if importlib.util.find_spec("ray") is None:
        if os.environ.get("OBSSPEC_REQUIRE_RAY") == "1":
            raise RuntimeError("OBSSPEC_REQUIRE_RAY=1 but Ray is missing: pip install -e '.[ray]' (make install)")
        return "needs Ray (pip install -e '.[ray]')"
    return ""


def start_ray_cluster(workers: int = 2, cpus: int = 4, **head_args):
    """A Ray cluster of this machine's loopback addresses only (Ray would otherwise use the
    machine's outward address even for a cluster of one machine)."""
    import os

    # (read when Ray is imported, here and in every process of the cluster: before any import)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, shutdown_at_exit=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False, **head_args})
    nodes = [cluster.add_node(num_cpus=cpus) for _ in range(workers)]
    return cluster, nodes


@pytest.fixture(scope="session")
def ray_cluster():
    if ray_missing():
        pytest.skip(ray_missing())
    cluster, nodes = start_ray_cluster(
        # a node whose raylet is gone is declared dead within ~2 s (Ray's default: ~30 s)
        _system_config={"health_check_period_ms": 500, "health_check_failure_threshold": 4,
                        "health_check_initial_delay_ms": 1000})
    RayCluster.address, RayCluster.cluster, RayCluster.workers = cluster.address, cluster, nodes
    try:
        yield RayCluster
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
        RayCluster.address, RayCluster.cluster, RayCluster.workers = "", None, []
