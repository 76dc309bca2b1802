"""Rollouts: episodes of policy turns and tool calls, run sequentially or with observation
speculation (DESIGN.md section 2), emitting one event stream that metrics, traces and displays
consume. `batch.run_episodes` runs every batch of episodes and writes its run directory;
`obsspec rollout` itself is obsspec/rollout_run.py (it builds its parts through obsspec/build.py)."""
