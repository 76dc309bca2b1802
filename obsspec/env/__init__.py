"""The terminal environment: bubblewrap sandboxes, tasks, task suites and Harbor import."""
