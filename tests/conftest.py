from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crashed import Crashed
from tests.nodetree import PLUGIN_DIR, NodeTree, have_plugins
from tests.private_node import cannot_run

# The machine's own CNI state, which no test may touch: plugins run in private namespaces, and
# a --root run's mount points exist only while it runs.
MACHINE_CNI_STATE = ("/var/lib/cni", "/etc/cni", "/run/netns", "/run/cni")


def _machine_cni_state() -> dict[str, list[str] | None]:
    state: dict[str, list[str] | None] = {}
    for path in MACHINE_CNI_STATE:
        try:
            state[path] = sorted(os.listdir(path))
        except OSError:
            state[path] = None
    return state


@pytest.fixture(scope="session", autouse=True)
def _machine_cni_state_untouched() -> Iterator[None]:
    before = _machine_cni_state()
    yield
    assert _machine_cni_state() == before, "a test changed the machine's own CNI state"


@pytest.fixture
def node(tmp_path: Path) -> NodeTree:
    return NodeTree(tmp_path / "node")


@pytest.fixture
def t0() -> float:
    """When the test writes its files: ctime cannot be set, so boots are placed around it."""
    return time.time()


@pytest.fixture
def crashed(node: NodeTree, t0: float) -> Crashed:
    if not have_plugins():
        cannot_run(f"containernetworking-plugins is not installed in {PLUGIN_DIR}")
    if os.geteuid() != 0:
        cannot_run("needs root: plugins run confined to the node's root (cni_reaper/confine.py)")
    return Crashed(node, t0)
