"""Rollouts: episodes of policy turns and tool calls, run sequentially or with observation
speculation (DESIGN.md section 2), emitting one event stream that metrics, traces and displays
consume."""
