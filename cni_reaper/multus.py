"""Multus's own cache of its delegates' results: the reservations Multus's DEL releases.

Multus (k8snetworkplumbingwg/multus-cni) runs its delegates through libcni with its own cache
dir, /var/lib/cni/multus, so each delegate's result is cached in /var/lib/cni/multus/results as
<delegate's network>-<container ID>-<ifname>, not in the runtime's results dir, whose entry for
the sandbox is Multus's own (multus-cni-network-<ID>-eth0 by default). The runtime's DEL of that
entry runs Multus's DEL, which DELs each delegate: a delegate's reservation with no entry of its
own network in the results dir is no orphan (shared/reference/node-state.md section 4).
"""

from __future__ import annotations

from collections.abc import Callable

from cni_reaper.node_root import LeavesRoot, exists_inside, host_path

RESULTS_DIR = "/var/lib/cni/multus/results"

# (network, container ID, ifname) -> where Multus cached that delegate's result, if it did
DelegateResults = Callable[[str, str, str], "str | None"]


def delegate_results(root: str) -> DelegateResults | None:
    """Where Multus cached a delegate's result, if it did; None when it keeps none on the node,
    as on most nodes, which then pay nothing per reservation. The names asked for are a store's
    and an owner's that host_local.py has vetted: no '/' in any of them. What cannot be looked
    at counts as cached: a reservation kept is the side doubt may err on."""
    try:
        if not exists_inside(root, RESULTS_DIR):
            return None
    except (OSError, LeavesRoot):
        pass

    def cached(network: str, container_id: str, ifname: str) -> str | None:
        node_path = f"{RESULTS_DIR}/{network}-{container_id}-{ifname}"
        try:
            found = exists_inside(root, node_path)
        except (OSError, LeavesRoot):
            found = True
        return host_path(root, node_path) if found else None

    return cached
