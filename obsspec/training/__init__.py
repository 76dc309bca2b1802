"""GRPO training with speculative rollouts (obsspec train)."""
