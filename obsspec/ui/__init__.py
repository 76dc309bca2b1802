"""What people see while a command runs: the live rollout dashboard (rich / plain / none) and
the tables printed at the end. Library code reports progress through obsspec/progress.py."""
