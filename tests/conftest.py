from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.nodetree import NodeTree


@pytest.fixture
def node(tmp_path: Path) -> NodeTree:
    return NodeTree(tmp_path / "node")


@pytest.fixture
def t0() -> float:
    """When the test writes its files: ctime cannot be set, so boots are placed around it."""
    return time.time()
