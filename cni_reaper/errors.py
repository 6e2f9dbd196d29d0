"""The reaper's failures and the exit statuses they map to, in the style of systemd-tmpfiles."""

from __future__ import annotations

from cni_reaper.choice import IntChoice


class ExitCode(IntChoice):
    OK = 0  # nothing wrong, or everything repaired
    INTERNAL = 1  # a bug: a traceback went to stderr
    USAGE = 2
    DATA = 65  # damage found that the policy leaves alone (EX_DATAERR)
    ACTION_FAILED = 73  # a DEL or a quarantine move failed (EX_CANTCREAT)
    REFUSED = 75  # lock held, or a runtime is running (EX_TEMPFAIL)
    NOPERM = 77  # a real run not as root (EX_NOPERM)
    INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + 2, as a shell reports it


class ReaperError(Exception):
    """A failure with a message meant for the operator, never a traceback."""

    in_json_report = False  # whether the --json document on stdout already holds it


class UsageError(ReaperError):
    pass


class RefusedError(ReaperError):
    pass


class NoPermissionError(ReaperError):
    """What it was asked to do needs root."""


class UnsafeInputError(ReaperError):
    """Something it was asked to inspect cannot be inspected without risk."""
