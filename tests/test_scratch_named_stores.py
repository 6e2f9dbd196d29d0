"""The host-local stores only Multus's scratch files name (a NetworkAttachmentDefinition's
dataDir, a tenant's choice): what a boot's first run records of them and a run's checks read,
each store whole or not at all, is bounded in names, in stores and in bytes, and one tenant's
store costs no other tenant's DEL. Found by the attack review of 7ccf67f (a bound on names in
all, which each of these broke)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cni_reaper import host_local
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed
from tests.test_host_local_del_scope import (
    B,
    OnTheNode,
    a_in_a_store_named_like_multus,
    bridge,
    by_ip,
    multus_scratch,
    plugin_dirs,
    tenant_delegate,
)

MIB = 1 << 20


def rchar() -> int:
    """Bytes read by this process and every child it reaped (the kernel adds a reaped child's
    I/O to its parent's, /proc/<pid>/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def test_on_the_node_a_store_of_large_files_is_read_to_a_mebibyte_in_all(
    crashed: Crashed,
) -> None:
    """A tenant's store (a root-made subdir of its emptyDir, trusted) of 256 names, each a hard
    link to one sparse file of exactly 1 MiB: no disk used, within the bound on names. Every
    run's check read each name whole (_doubt_large, to MAX_DOUBTED_BYTES each): at 99,999
    names, 100 GiB and 33 s a run. A store's files larger than a reservation are read to
    MAX_DOUBTED_BYTES in all, and none once one cannot be told."""
    k = 256
    root = crashed.node.root
    big = root / "srv/t/big"
    big.mkdir(parents=True)
    for n in range(k):
        if n % 60_000 == 0:  # a file system's most links to one file: 65,000 on ext4
            seed = big / f"seed{n}"
            with open(seed, "wb") as f:
                f.truncate(MIB)  # sparse: no block on disk
        else:
            os.link(seed, big / f"f{n}")
    # Multus's first delegate keeps its own network's name (the orphan's store), the second
    # is the tenant's NetworkAttachmentDefinition.
    own = bridge("multus-cni-network", "10.244.0")
    bin_dir = a_in_a_store_named_like_multus(crashed, own, tenant_delegate("/srv/t"))
    crashed.reboot()
    node = OnTheNode(crashed)

    before = rchar()
    code, report = node.run("--dry-run", *plugin_dirs(root, bin_dir))  # no plugin runs
    read = rchar() - before

    orphan = by_ip(report)["10.244.0.5"]
    assert (code, orphan["action"]) == (ExitCode.DATA, "leave"), orphan
    assert "bytes in all" in orphan["reason"], orphan["reason"]
    # What a run may read of a store of k names, were each name bounded as a reservation is
    # (MAX_RESERVATION_BYTES), with 64 MiB for the interpreter and the plugins besides.
    bound = k * host_local.MAX_RESERVATION_BYTES + 64 * MIB
    assert read <= bound, f"the run read {read / MIB:.0f} MiB for a store of {k} names"


@pytest.mark.parametrize("attacker", [False, True])
def test_on_the_node_a_tenant_s_store_costs_no_other_tenant_s_del(
    crashed: Crashed, attacker: bool
) -> None:
    """A (the attacker's pod) and B (another tenant's) are both orphans of Multus's network.
    A's scratch file names a dataDir in A's emptyDir (mode 0777, as kubelet makes it: the
    check never reads it, it "may be written by others than root") holding 99,998 empty
    files; B's names its own NetworkAttachmentDefinition's store: B's one address of the
    previous boot, last_reserved_ip.0 and lock. With one bound on the names of all such
    stores, the check counted A's unread store against it, and B's DEL, which nothing is
    against, was left: one tenant left every other tenant's DEL through Multus. Each store
    is bounded on its own, and one others may write is neither counted nor recorded.
    (attacker=False is the control.)"""
    root = crashed.node.root
    first = bridge("multus-cni-network", "10.244.0")  # Multus's own network, as eth0
    bin_dir = a_in_a_store_named_like_multus(crashed, first, tenant_delegate("/srv/t"))
    own = root / "var/lib/cni/networks/multus-cni-network"
    (own / "10.244.0.6").write_bytes(f"{B}\r\neth0".encode())
    scratch = root / "var/lib/cni/multus"
    (scratch / B).write_text(multus_scratch(first, tenant_delegate("/srv/u", "small")))
    big, small = root / "srv/t/big", root / "srv/u/small"
    big.mkdir(parents=True)
    big.chmod(0o777)  # an emptyDir
    for n in range(host_local.MAX_NAMED_STORE_NAMES - 2 if attacker else 0):
        (big / f"f{n}").touch()
    small.mkdir(parents=True)
    (small / "10.246.0.7").write_bytes(f"{B}\r\nnet1".encode())
    (small / "last_reserved_ip.0").write_text("10.246.0.7")
    (small / "lock").touch()
    crashed.reboot()
    node = OnTheNode(crashed)

    code, report = node.run(*plugin_dirs(root, bin_dir))

    attacker_orphan, victim = by_ip(report)["10.244.0.5"], by_ip(report)["10.244.0.6"]
    assert attacker_orphan["action"] == "leave", attacker_orphan  # its store is unread: right
    assert (victim["action"], victim["outcome"]) == ("del", "done"), json.dumps(
        {"code": code, "victim": victim, "warnings": report["warnings"]}, indent=1
    )
    assert not (small / "10.246.0.7").exists()


def test_the_check_looks_at_so_many_stores_only_scratch_files_name_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run records MAX_NAMED_STORES (64) distinct stores at most; the check
    (StoreReads._named_store_refusal) counted every distinct store a scratch file's delegates
    named, each to the bound + 1, before refusing it: a tenant's pod's scratch file naming
    200 stores past the bound (here the bound made 100 names; on a node, any dir of more
    names within 8 levels, /usr's, that a tenant need not make) had each run count 200
    times as much. The check looks at MAX_NAMED_STORES of them at most, and refuses the rest
    uncounted."""
    monkeypatch.setattr(host_local, "MAX_NAMED_STORE_NAMES", 100)
    counted = []
    real = host_local._names_below

    def counting(dir_fd: int, at_most: int, depth: int) -> int:
        found = real(dir_fd, at_most, depth)
        if depth == 0:
            counted.append(found)
        return found

    monkeypatch.setattr(host_local, "_names_below", counting)
    stores = []
    for k in range(200):
        store = tmp_path / f"s{k}"
        store.mkdir()
        for n in range(101):
            (store / f"f{n}").touch()
        stores.append(str(store))
    reads = host_local.StoreReads(None, None)  # type: ignore[arg-type]  # counting needs neither

    refused = [reads._named_store_refusal(store, "/var/lib/cni/multus/x") for store in stores]

    assert all(refused)
    bound = host_local.MAX_NAMED_STORES * (host_local.MAX_NAMED_STORE_NAMES + 1)
    assert sum(counted) <= bound, f"{sum(counted)} names counted over {len(counted)} stores"


@pytest.mark.parametrize("data_dir", ["/var/lib/cni/networks", "/var/lib/cni//networks/", "/srv/l"])
def test_on_the_node_a_conf_store_a_scratch_file_names_again_is_no_such_store(
    crashed: Crashed, data_dir: str
) -> None:
    """Multus's own store, which a conf names, holds A's orphan and more names than the
    bound; A's scratch file names it again as a NAD's dataDir, spelled plainly, with '//',
    or through a symlink. It is not held to the bound, in the first run or the check, and
    A's DEL runs. (Held in the attack review.)"""
    root = crashed.node.root
    (root / "srv").mkdir()
    (root / "srv/l").symlink_to("/var/lib/cni/networks")
    first = bridge("multus-cni-network", "10.244.0")
    again = tenant_delegate(data_dir, "multus-cni-network")
    bin_dir = a_in_a_store_named_like_multus(crashed, first, again)
    own = root / "var/lib/cni/networks/multus-cni-network"
    for n in range(host_local.MAX_NAMED_STORE_NAMES):
        (own / f"f{n}").touch()
    crashed.reboot()
    node = OnTheNode(crashed)

    code, report = node.run(*plugin_dirs(root, bin_dir))

    orphan = by_ip(report)["10.244.0.5"]
    assert not any("names" in w for w in report["warnings"]), report["warnings"]
    assert (code, orphan["action"], orphan["outcome"]) == (ExitCode.OK, "del", "done"), orphan


@pytest.mark.parametrize("names", [3000, host_local.MAX_NAMED_STORE_NAMES + 1])
def test_on_the_node_the_first_run_and_the_checks_agree_on_the_stores_they_take(
    crashed: Crashed, names: int
) -> None:
    """B's damaged Multus entry names S1, A's orphan S2, each of so many names. With one
    bound on the names of all such stores, checked in another order by each of the entries'
    and the orphans' checks (a budget each), the first run recorded S1 and said S2 was past
    the bound, "the DELs that would release from them are left", and the orphans' check read
    S2 whole all the same and A's DEL ran, exit 0. Each store is now taken, or not, on its
    own: within the bound both are recorded and read and both DELs run (exit 0, no warning);
    past it, neither is, both DELs are left (exit 65), and the run says so of each."""
    root = crashed.node.root
    first = bridge("multus-cni-network", "10.244.0")
    bin_dir = a_in_a_store_named_like_multus(crashed, first, tenant_delegate("/srv/a", "s2"))
    scratch = root / "var/lib/cni/multus"
    (scratch / B).write_text(multus_scratch(first, tenant_delegate("/srv/b", "s1")))
    for store in (root / "srv/a/s2", root / "srv/b/s1"):
        store.mkdir(parents=True)
        for n in range(names):
            (store / f"f{n}").touch()
    entry = crashed.node.write_result(f"multus-cni-network-{B}-eth0", b"")
    crashed.reboot()
    node = OnTheNode(crashed)

    code, report = node.run(*plugin_dirs(root, bin_dir))

    orphan, (found,) = by_ip(report)["10.244.0.5"], report["entries"]
    past = [w for w in report["warnings"] if "names" in w]
    if names <= host_local.MAX_NAMED_STORE_NAMES:
        assert (code, orphan["action"], found["outcome"], past) == (
            ExitCode.OK,
            "del",
            "done",
            [],
        ), report
        assert not entry.exists()
    else:
        assert (code, orphan["action"], found["action"]) == (ExitCode.DATA, "leave", "leave")
        assert len(past) == 2 and entry.exists(), past
