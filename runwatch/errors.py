"""Errors the command line turns into one-line messages instead of tracebacks."""


class RunwatchError(Exception):
    """A failure the user can act on; the CLI prints its message and exits with 1."""


class UsageError(RunwatchError):
    """A bad argument or setting; the CLI prints its message and exits with 2."""
