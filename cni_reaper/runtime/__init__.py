"""The container runtimes of a node: where their configs say they live (config.py), and what
/run and /proc say is alive (liveness.py)."""

from __future__ import annotations

from cni_reaper.runtime.liveness import answering_socket

__all__ = ["answering_socket"]
