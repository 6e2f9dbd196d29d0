"""sd_notify STATUS= lines while the unit works: a datagram to $NOTIFY_SOCKET, no library needed."""

from __future__ import annotations

from collections.abc import Mapping

from cni_reaper.escape import printable


class Notifier:
    def __init__(self, environ: Mapping[str, str]) -> None:
        address = environ.get("NOTIFY_SOCKET", "")
        # "@name" is an abstract socket; anything else must be an absolute path.
        if address.startswith("@"):
            self._address: str | None = "\0" + address[1:]
        elif address.startswith("/"):
            self._address = address
        else:
            self._address = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def status(self, text: str) -> None:
        if self._address is None:
            return
        import socket  # noqa: PLC0415 (a run by hand has no NOTIFY_SOCKET; it never loads this)

        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(f"STATUS={printable(text)}".encode(), self._address)
        except OSError:
            pass  # a status line is a courtesy; the run must not fail over it
