"""DELs of several networks at once, never two of one network: as a runtime never runs them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeVar

    Item = TypeVar("Item")
    Done = TypeVar("Done")

# How long the caller waits for a result before it gets a tick (None) to do other work with.
TICK_SECONDS = 0.25
_WORKER_DONE = None


def in_parallel(
    groups: list[list[Item]], work: Callable[[Item], Done], workers: int
) -> Iterator[tuple[Item, Done] | None]:
    """Worker threads take a group at a time and do its items in order; this generator hands
    on each (item, what work returned) as it comes, or None, a tick, when none came for a
    while. A worker goes straight on to its group's next item: what the caller does with a
    result never stands between two plugins."""
    pending: queue.SimpleQueue[list[Item]] = queue.SimpleQueue()
    for group in groups:
        pending.put(group)
    done: queue.SimpleQueue[tuple[Item, Done] | None] = queue.SimpleQueue()
    failures: list[BaseException] = []
    stop = threading.Event()  # set when the caller gives up: workers start nothing more

    def worker() -> None:
        try:
            while not stop.is_set():
                try:
                    group = pending.get_nowait()
                except queue.Empty:
                    return
                for item in group:
                    if stop.is_set():
                        return
                    done.put((item, work(item)))
        except BaseException as e:  # a bug: raised again below, once every worker is done
            failures.append(e)
        finally:
            done.put(_WORKER_DONE)

    threads = [
        threading.Thread(target=worker, name=f"del-{n}", daemon=True)
        for n in range(min(workers, len(groups)))
    ]
    for thread in threads:
        thread.start()
    try:
        running = len(threads)
        while running:
            try:
                item = done.get(timeout=TICK_SECONDS)
            except queue.Empty:
                yield None
                continue
            if item is _WORKER_DONE:
                running -= 1
                continue
            yield item
    finally:
        # Also when the caller stops early or raised: no plugin may outlive the run.
        stop.set()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
