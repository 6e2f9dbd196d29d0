from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cni_reaper import failpoint
from cni_reaper.runtime.inventory import META_DB_READ
from tests import real_libcni
from tests.crashed import Crashed
from tests.meta_db_running import Interfere
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


def pytest_configure(config: pytest.Config) -> None:
    # A suite started with SIGINT ignored (nohup, `pytest &` from a script) hands that on to
    # every process it starts, through exec: Python then never raises KeyboardInterrupt, and
    # the interrupt tests' Ctrl-C is lost. A handler is reset to the default at exec instead.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
        cannot_run("needs root: plugins run confined to the node's root (repair/confine.py)")
    return Crashed(node, t0)


@pytest.fixture(scope="session")
def libcni_build() -> real_libcni.Built:
    """tests/libcni_client built once on the distribution's libcni (Debian 12: 1.1.2), offline,
    or taken from .test-cache/ if this source, Go and libcni were built before. Missing Go or
    libcni's source skips, and fails in CI; a build that fails fails."""
    reason = real_libcni.why_not_buildable()
    if reason:
        cannot_run(reason)
    try:
        return real_libcni.build_client()
    except real_libcni.BuildFailed as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def libcni_client(libcni_build: real_libcni.Built) -> real_libcni.LibcniClient:
    return real_libcni.LibcniClient(libcni_build.path)


@pytest.fixture
def after_each_read() -> Iterator[Interfere]:
    """Have an action run after each read of containerd's meta.db, given the read's number
    (from 1); the list returned holds the numbers of the reads made."""
    reads: list[int] = []

    def interfere(action: Callable[[int], None]) -> list[int]:
        def step() -> None:
            reads.append(len(reads) + 1)
            action(len(reads))

        failpoint.interfere(META_DB_READ, step)
        return reads

    yield interfere
    failpoint.interfere(META_DB_READ, None)
