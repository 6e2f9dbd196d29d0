"""The container runtimes of a node: whether one is up (liveness.py)."""

from __future__ import annotations

from cni_reaper.runtime.liveness import answering_socket

__all__ = ["answering_socket"]
