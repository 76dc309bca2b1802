"""`obsspec export`: a training run's policy and world model as model folders that load and serve
as they are (source: which checkpoint and bases; models: merging and writing; card: README.md and
obsspec.json; run: `export_run`, what the command calls)."""


class ExportError(ValueError):
    """A folder that is not a run, a step that is not there: one line for the user."""
