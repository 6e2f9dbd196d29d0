"""The reaper as tests.clocked_run runs it, on a clock the caller chooses, and then the CPU
seconds its own process used, in all its threads, written to the file named first: a line
`<seconds> total`, and one `<seconds> <stage>` for each stage below, by the CPU clock of the
thread that ran it (the count costs about 1.5 us a call, measured: some 0.6 ms of a run of
200 DELs).

Usage: python -m bench.own_cpu FILE CLOCK -- ARGV...
The parent's wait4() cannot say this: a process's usage as its parent reaps it includes the
children it reaped, and the reaper reaps every plugin it runs.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cni_reaper import command

command.load()  # as the installed command loads the package

from cni_reaper import cli, plugin  # noqa: E402
from cni_reaper.repair import apply  # noqa: E402

START_UP = "the interpreter and the imports"
# Where a real run's CPU goes after its start-up: (the class or module, the function, its
# stage). A stage called inside another is counted in both: the table says which holds which.
STAGES = (
    (cli, "_pipeline", "the run, in its main thread (or its confined one)"),
    (apply, "_quarantine", "  of which the quarantine's batches"),
    (apply, "_replay", "each DEL, in the workers"),
    (plugin.ProcessRunner, "run", "  of which its plugins started, fed, read and reaped"),
)


def timed_by_thread(
    function: Callable[..., Any], stage: str, spent: dict[str, float], lock: threading.Lock
) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            with lock:
                spent[stage] += time.thread_time() - start

    return counted


def written_as_it_leaves(
    main: Callable[..., int], out: str, start_up: float, spent: dict[str, float]
) -> Callable[..., int]:
    """main, and then the figures written to out, before cli.console leaves as it always does."""

    def run(*args: Any, **kwargs: Any) -> int:
        code = main(*args, **kwargs)
        with open(out, "w") as f:
            f.write(f"{time.process_time()} total\n{start_up} {START_UP}\n")
            f.writelines(f"{seconds} {stage}\n" for stage, seconds in spent.items())
        return code

    return run


if __name__ == "__main__":
    start_up = time.process_time()
    spent = {stage: 0.0 for _, _, stage in STAGES}
    lock = threading.Lock()
    for owner, name, stage in STAGES:
        setattr(owner, name, timed_by_thread(getattr(owner, name), stage, spent, lock))
    split = sys.argv.index("--")
    out, now = sys.argv[1], float(sys.argv[2])
    cli.main = written_as_it_leaves(cli.main, out, start_up, spent)
    cli.console(sys.argv[split + 1 :], clock=lambda: now)
