"""The reaper as its own process, on a clock the caller chooses (crash tests, benchmarks).

Usage: python -m tests.clocked_run CLOCK -- ARGV...
A process of its own, so that a failpoint's SIGKILL kills it and not the test; it leaves as
the installed command does (command.console).
"""

from __future__ import annotations

import sys

from cni_reaper import command

if __name__ == "__main__":
    split = sys.argv.index("--")
    now = float(sys.argv[1])
    command.console(sys.argv[split + 1 :], clock=lambda: now)
