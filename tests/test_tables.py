"""The final tables read whole without a terminal: at 80 columns (CI logs, `| tee`) no label wraps."""

from types import SimpleNamespace

import pytest
from rich.table import Table

from obsspec.env.families import all_families
from obsspec.ui import tables

LONGEST_FAMILY = max(all_families(), key=len)  # the built-in suites
TRAINING = {
    "steps": 20, "reward_first_third": 0.31, "reward_last_third": 0.35,
    "success_by_kind": {LONGEST_FAMILY: [0.25, 0.5], "dir-stats": [0.8, 0.9]},
    "eval": {"before": {"success_frac": 0.338, "success_by_kind": {f"{LONGEST_FAMILY}/a": [1, 4]}},
             "after": {"success_frac": 0.325, "success_by_kind": {f"{LONGEST_FAMILY}/a": [2, 4]}}},
    "val_gain": {"mean": -0.0125, "ci95": 0.05, "tasks": 20}, "hit_rate_mean": 0.592,
    "wm_hits": 12, "wm_hit_rate_mean": 0.141,
    "wm_class_hits": {"find": [4, 19], "other": [4, 10], "text": [3, 4], "cat": [1, 18], "ls": [0, 5]},
    "cache_hits": 15, "cache_hit_rate_mean": 0.1, "sibling_hits": 42, "skipped_frac_mean": 0.946,
    "skips": {"busy": 806, "low_gain": 3}, "committed_delay_frac_max": 0.004,
    "latency_saved_sec": 3.2, "latency_saved_frac": 0.003, "wm_version": 10, "infra_failures": 0,
    "out_dir": "runs/demo/train"}
PAIRED = {"steps": 20, "rollout_reduction": {"mean": -0.02, "ci95": 0.03},
          "latency_reduction": {"mean": -0.01, "ci95": 0.02}, "spec_sec": 300, "seq_sec": 310,
          "episodes_differing": 1, "episodes_differing_in_action": 0, "tokens_differing": 12}
MODE = {**{key: 0.5 for _, key, _ in tables.ROWS}, "predictor": "tiered"}
ROLLOUT = {"modes": {"sequential": MODE, "speculative": MODE}, "tool_latency": {"emulated": True},
           "comparison": {"mean_latency_reduction": 0.026, "reduction_ci95": 0.013, "pairs": 3,
                          "reduction_per_pair": [0.03, 0.02, 0.028], "verdict": "gain",
                          "episodes_compared_for_latency": 16, "token_identical": True,
                          "episodes_differing": 0}}


@pytest.mark.parametrize("render", [
    lambda: tables.print_training_table(TRAINING, SimpleNamespace(kind="lognormal")),
    lambda: tables.print_training_table({**TRAINING, "paired": PAIRED}, SimpleNamespace(kind="lognormal")),
    lambda: tables.print_rollout_table(ROLLOUT),
], ids=["training", "training-paired", "rollout"])
def test_final_tables_at_80_columns_keep_every_label_on_one_line(render, monkeypatch, capsys):
    labels = []
    add_row = Table.add_row
    monkeypatch.setattr(Table, "add_row", lambda self, label, *values, **kw:
                        (labels.append(label.strip()), add_row(self, label, *values, **kw)))
    monkeypatch.setenv("COLUMNS", "80")
    render()
    lines = capsys.readouterr().out.splitlines()
    assert labels and max(len(line) for line in lines) <= 80
    split = [label for label in labels if not any(label in line for line in lines)]
    assert not split, f"labels broken across lines at 80 columns: {split}"
