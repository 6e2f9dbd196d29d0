from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.crashed import Crashed
from tests.nodetree import PLUGIN_DIR, NodeTree, have_plugins
from tests.private_node import cannot_run


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
