"""A $NOTIFY_SOCKET of the test's own, as systemd gives a unit one: what was sent to it."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def status_lines(address: Path) -> Iterator[list[str]]:
    """Listen at address while the block runs; the list then holds every datagram sent."""
    sent: list[str] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(address))
        listener.settimeout(0)
        yield sent
        while True:
            try:
                sent.append(listener.recv(4096).decode())
            except BlockingIOError:
                break
