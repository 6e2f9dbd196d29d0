"""The seed bug with the real libcni, and its repair: attachments made and torn down by libcni
1.1.2 itself (tests/libcni_client) through Debian's bridge, ptp, host-local and portmap, in a
private network and mount namespace (tests/libcni_scenario.py).

The headline: before the repair, the runtime's DEL of every attachment whose results file the
crash damaged fails with the seed error and runs no plugin; after cni-reaper, the runtime's DEL
succeeds for every attachment it still knows, and once those DELs have run no host-local store
holds a reservation.

The node keeps containerd's records (a real bbolt meta.db) naming the sandboxes the runtime
knows. Beside them: attachments of sandboxes it forgot (whole results files, DEL'd by the reaper
with their cached result and capability args), orphaned reservations (results files deleted
outright, some of forgotten sandboxes), a network whose conflist is gone since the crash (DEL'd
with the config one of its entries cached), and pods the runtime sets up after the reaper's
boot-time run, which a later run leaves alone. The networks cover IPv4, IPv6 and dual-stack
ranges, several ranges and range sets with their last_reserved_ip files, dataDirs inside and
outside /var/lib/cni, reservations in the ID-only format, one container on two networks, and
conflists of cniVersion 0.4.0 and 1.0.0. A second node has no runtime records at all: the
reaper cannot tell which sandboxes are forgotten there and keeps every whole entry.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest

from tests.libcni_scenario import (
    DAMAGED,
    Attachment,
    AttachmentSeen,
    Observed,
    Scenario,
    Stage,
    bridge_network,
    ptp_network,
    start_in_namespace,
    why_not,
)
from tests.nodetree import CONTAINER_IDS
from tests.private_node import cannot_run
from tests.real_libcni import LibcniClient, seed_error

pytestmark = pytest.mark.netns

OUTSIDE_DATA_DIR = "/var/lib/cni-ipam"  # a tmpfs in the namespace; bound into the reaper's root
INSIDE_DATA_DIR = "/var/lib/cni/ipam-multi"

NETWORKS = (
    bridge_network("bridge-net", [["10.88.0.0/24"]], bridge="cni-br0"),
    ptp_network("ptp-net", [["10.89.0.0/24"]]),  # cniVersion 0.4.0: DEL reads the cache too
    bridge_network(
        "dual-net", [["10.90.0.0/24"], ["fd90::/64"]], bridge="cni-br1", data_dir=OUTSIDE_DATA_DIR
    ),
    ptp_network("v6-net", [["fd91::/64"]], cni_version="1.0.0"),
    # Two ranges in the first range set (the third pod spills into the second), and a second
    # range set: a last_reserved_ip file per set. ptp: bridge 1.1.1 gives its bridge the
    # gateway of one IPv4 range only.
    ptp_network(
        "multi-net",
        [
            [
                {"subnet": "10.92.0.0/24", "rangeStart": "10.92.0.10", "rangeEnd": "10.92.0.11"},
                "10.92.1.0/24",
            ],
            ["10.93.0.0/24"],
        ],
        data_dir=INSIDE_DATA_DIR,
        cni_version="1.0.0",
    ),
    # Removed from the conf dir after the crash: only the config its entries cached is left.
    bridge_network("gone-net", [["10.94.0.0/24"]], bridge="cni-br2"),
)

_ids = iter(CONTAINER_IDS)
TWO_NETWORKS = next(_ids)  # one pod on bridge-net (eth0) and ptp-net (net1), as with multus


def forgotten(network: str, results_file: str = "valid", **kw: Any) -> Attachment:
    """An attachment of a sandbox the runtime's records do not name: nobody but the reaper
    will ever DEL it."""
    return Attachment(network, next(_ids), results_file=results_file, runtime_dels=False, **kw)


ATTACHMENTS = (
    Attachment("bridge-net", TWO_NETWORKS, "eth0", "empty"),
    Attachment("ptp-net", TWO_NETWORKS, "net1", "valid"),
    Attachment("bridge-net", next(_ids), results_file="zeroed", id_only_reservation=True),
    Attachment("bridge-net", next(_ids), results_file="truncated"),
    Attachment("bridge-net", next(_ids), results_file="valid"),
    forgotten("bridge-net"),
    forgotten("bridge-net", "deleted"),
    Attachment("ptp-net", next(_ids), results_file="truncated", id_only_reservation=True),
    Attachment("ptp-net", next(_ids), results_file="empty"),
    Attachment("ptp-net", next(_ids), results_file="deleted"),
    forgotten("ptp-net", id_only_reservation=True),
    Attachment("dual-net", next(_ids), results_file="empty"),
    Attachment("dual-net", next(_ids), results_file="zeroed", id_only_reservation=True),
    Attachment("dual-net", next(_ids), results_file="valid"),
    forgotten("dual-net"),
    Attachment("dual-net", next(_ids), results_file="deleted", id_only_reservation=True),
    Attachment("v6-net", next(_ids), results_file="truncated"),
    Attachment("v6-net", next(_ids), results_file="valid"),
    forgotten("v6-net"),
    forgotten("v6-net", "deleted"),
    Attachment("multi-net", next(_ids), results_file="empty"),
    Attachment("multi-net", next(_ids), results_file="valid"),
    Attachment("multi-net", next(_ids), results_file="truncated", id_only_reservation=True),
    forgotten("multi-net"),
    Attachment("multi-net", next(_ids), results_file="deleted"),
    Attachment("gone-net", next(_ids), results_file="empty"),
    forgotten("gone-net"),
    forgotten("gone-net", "deleted", id_only_reservation=True),
)
# Pods the runtime sets up after the reaper's boot-time run.
CURRENT_BOOT = (
    Attachment("bridge-net", next(_ids)),
    Attachment("dual-net", next(_ids)),
    Attachment("multi-net", next(_ids)),
)
SCENARIO = Scenario(
    networks=NETWORKS,
    attachments=ATTACHMENTS,
    containerd_records=True,
    removed_networks=("gone-net",),
    current_boot=CURRENT_BOOT,
    # The kernel's rules kept (a reboot drops them): portmap's DEL removes a container's DNAT
    # rules only when it is handed the port mappings, so what is left shows who got them.
    flush_iptables_at_crash=False,
)
GONE_WHOLE = next(a for a in ATTACHMENTS if a.network == "gone-net" and a.results_file == "valid")
PORTMAP_NETWORKS = {"bridge-net", "dual-net", "gone-net"}

# No runtime records on this node: nothing tells the reaper which sandboxes are forgotten. (A
# node of its own: its container IDs may be the first node's.)
NO_RECORDS = Scenario(
    networks=(NETWORKS[0],),
    attachments=(
        Attachment("bridge-net", CONTAINER_IDS[0], runtime_dels=False),
        Attachment("bridge-net", CONTAINER_IDS[1], results_file="deleted", runtime_dels=False),
        Attachment("bridge-net", CONTAINER_IDS[2]),
    ),
)

# host-local's capacity of each range set (rangeStart to rangeEnd, less the gateway).
CAPACITY = {
    ("bridge-net", 0): 253,
    ("ptp-net", 0): 253,
    ("dual-net", 0): 253,
    ("dual-net", 1): 2**64 - 2,
    ("v6-net", 0): 2**64 - 2,
    ("multi-net", 0): 2 + 253,
    ("multi-net", 1): 253,
    ("gone-net", -1): 0,  # no conf dir names it: its ranges are not known
}


@pytest.fixture(scope="module")
def played(
    tmp_path_factory: pytest.TempPathFactory, libcni_client: LibcniClient
) -> dict[str, Observed]:
    """Both nodes, played at once, each in a namespace of its own."""
    reason = why_not()
    if reason:
        cannot_run(reason)
    playing = {
        name: start_in_namespace(scenario, libcni_client, tmp_path_factory.mktemp(name))
        for name, scenario in (("records", SCENARIO), ("no-records", NO_RECORDS))
    }
    seen: dict[str, Observed] = {}
    failed: list[str] = []
    for name, p in playing.items():  # every one waited for, whichever fails
        try:
            seen[name] = p.wait()
        except RuntimeError as e:
            failed.append(f"{name}: {e}")
    if failed:
        pytest.fail("\n".join(failed))
    return seen


@pytest.fixture(scope="module")
def observed(played: dict[str, Observed]) -> Observed:
    return played["records"]


def reserved(observed: Observed, stage: Stage) -> dict[str, dict[str, str]]:
    """Per network, its store's reservations at a stage."""
    return {s["network"]: dict(s[stage]["reservations"]) for s in observed["stores"]}


def seen_with(observed: Observed) -> Iterator[tuple[AttachmentSeen, Attachment]]:
    return zip(observed["attachments"], ATTACHMENTS)


def is_forgotten_whole(a: Attachment) -> bool:
    return not a.runtime_dels and a.results_file == "valid"


def range_set_of(network: str, ip: str) -> int:
    """Which range set of the network's ipam holds ip (by subnet); -1: a network no conf dir
    names any more, whose ranges the reaper cannot know."""
    if network == "gone-net":
        return -1
    conflist = next(n for n in NETWORKS if n["name"] == network)
    ranges = conflist["plugins"][0]["ipam"]["ranges"]
    address = ipaddress.ip_address(ip)
    for index, range_set in enumerate(ranges):
        if any(address in ipaddress.ip_network(r["subnet"]) for r in range_set):
            return index
    raise AssertionError(f"{ip} is in no range set of {network}")


def count_by_set(reservations: dict[str, dict[str, str]]) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for network, held in reservations.items():
        for ip in held:
            key = (network, range_set_of(network, ip))
            counts[key] = counts.get(key, 0) + 1
    return counts


def pools_of(report: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(p["network"], p["range_set"]): p for p in report["pools"]}


def conf_file(network: str) -> str:
    number = next(i for i, n in enumerate(NETWORKS) if n["name"] == network)
    return f"/etc/cni/net.d/{10 + number}-{network}.conflist"


# ---- The attachments and the crash --------------------------------------------------------------


def test_libcni_made_every_attachment_through_the_real_plugins(observed: Observed) -> None:
    before = reserved(observed, "before_crash")
    for seen, a in seen_with(observed):
        assert seen["add"]["ok"], seen["add"]["error"]
        owner = a.container_id if a.id_only_reservation else f"{a.container_id}\r\n{a.ifname}"
        assert seen["ips"]
        for ip in seen["ips"]:
            assert before[a.network][ip] == owner
    every = [ip for s in observed["attachments"] + observed["current_boot"] for ip in s["ips"]]
    assert len(set(every)) == len(every)
    # The crash took every link the attachments made, as a reboot does.
    assert observed["links_left_by_crash"] == []
    # containerd's records name the sandbox of every container the runtime still knows.
    assert observed["known_sandboxes"] == sorted(
        {a.container_id for a in ATTACHMENTS if a.runtime_dels}
    )
    assert observed["removed_conflists"] == [conf_file("gone-net").rsplit("/", 1)[1]]


def test_the_ranges_were_really_used(observed: Observed) -> None:
    by_network: dict[str, list[str]] = {a.network: [] for a in ATTACHMENTS}
    for seen, a in seen_with(observed):
        by_network[a.network] += seen["ips"]
    assert all(":" not in ip for ip in by_network["bridge-net"])
    dual = by_network["dual-net"]
    assert len([ip for ip in dual if ":" in ip]) == len([ip for ip in dual if ":" not in ip]) == 5
    assert all(ip.startswith("fd91:") for ip in by_network["v6-net"])
    # The first range set's first range holds two addresses: the third pod spills over.
    assert sorted(by_network["multi-net"]) == sorted(
        ["10.92.0.10", "10.92.0.11", *(f"10.92.1.{n}" for n in range(2, 5))]
        + [f"10.93.0.{n}" for n in range(2, 7)]
    )
    stores = {s["network"]: s for s in observed["stores"]}
    assert stores["dual-net"]["path"] == f"{OUTSIDE_DATA_DIR}/dual-net"
    assert stores["multi-net"]["path"] == f"{INSIDE_DATA_DIR}/multi-net"
    assert stores["multi-net"]["before_crash"]["last_reserved_ip"] == {
        "last_reserved_ip.0": "10.92.1.4",
        "last_reserved_ip.1": "10.93.0.6",
    }


# ---- Before the repair --------------------------------------------------------------------------


def test_before_the_repair_libcni_del_fails_with_the_seed_error(observed: Observed) -> None:
    tried = 0
    for seen, a in seen_with(observed):
        if a.results_file in DAMAGED:
            tried += 1
            attempt = seen["del_before"]
            assert attempt is not None
            assert attempt["ok"] is False
            assert attempt["error"] == seed_error(a.network, a.results_file)
        else:
            assert seen["del_before"] is None
    assert tried == 11
    # The failing DELs ran no plugin: every address is still reserved.
    assert reserved(observed, "at_repair") == reserved(observed, "before_crash")


# ---- The reaper's boot-time run -----------------------------------------------------------------


def test_the_reaper_repairs_and_exits_0(observed: Observed) -> None:
    reaper = observed["reaper"]
    assert reaper["exit"] == 0, reaper["stderr"]
    report = reaper["report"]
    assert report is not None
    entries = {e["path"]: e for e in report["entries"]}
    for a in ATTACHMENTS:
        if a.results_file == "deleted":
            assert a.results_name not in entries
            continue
        entry = entries[a.results_name]
        if a.results_file == "valid" and a.runtime_dels:
            assert (entry["action"], entry["outcome"]) == ("keep", "skipped")
            assert "containerd loads it at start" in entry["reason"], entry
        else:
            assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
    whole_known = {
        a.results_name for a in ATTACHMENTS if a.results_file == "valid" and a.runtime_dels
    }
    assert observed["results_after_repair"] == sorted(whole_known)
    moved = {
        a.results_name for a in ATTACHMENTS if a.results_file in DAMAGED or is_forgotten_whole(a)
    }
    assert {q.split("/", 1)[1] for q in observed["quarantine"] if "/host-local/" not in q} == {
        *moved,
        *(f"{name}.json" for name in moved),
    }
    # Every address was released by a DEL: none went to the quarantine.
    assert [q for q in observed["quarantine"] if "/host-local/" in q] == []
    (records,) = [line for line in report["runtime_records"] if line.startswith("containerd:")]
    known = len(observed["known_sandboxes"] or [])
    assert records.endswith(f"meta.db: {known} sandboxes (namespace k8s.io: {known})")


def test_forgotten_sandboxes_are_deleted_with_their_cached_result_and_capability_args(
    observed: Observed,
) -> None:
    report = observed["reaper"]["report"]
    assert report is not None
    entries = {e["path"]: e for e in report["entries"]}
    forgotten_whole = [(s, a) for s, a in seen_with(observed) if is_forgotten_whole(a)]
    assert {a.network for _, a in forgotten_whole} == {n["name"] for n in NETWORKS}
    for seen, a in forgotten_whole:
        entry = entries[a.results_name]
        assert "no runtime will know" in entry["reason"], entry
        assert "no runtime has a record of it" in entry["reason"], entry
        assert sorted(entry["del"]["released"]) == sorted(seen["ips"])
        if a.network == "gone-net":
            assert entry["del"]["config"] == f"the config cached in {a.results_name}"
        else:
            assert entry["del"]["config"].endswith(conf_file(a.network))
    # portmap got each forgotten attachment's cached port mappings as runtimeConfig: its DNAT
    # rules are gone. A DEL with no cached result (a damaged entry, an orphan) cannot give
    # portmap the mappings: those rules stay, until the runtime's own DEL.
    dnat = observed["dnat_rules_of"]
    on_portmap = {a.container_id for a in ATTACHMENTS if a.network in PORTMAP_NETWORKS}
    assert set(dnat["before_crash"]) == on_portmap
    assert set(dnat["after_repair"]) == on_portmap - {
        a.container_id for _, a in forgotten_whole if a.network in PORTMAP_NETWORKS
    }


def test_orphaned_reservations_are_deleted_with_their_owners_id_and_ifname(
    observed: Observed,
) -> None:
    """Reservations whose results file the crash deleted (some of sandboxes the runtime
    forgot, some ID-only): DEL'd through their network's config, eth0 for ID-only ones. Only
    they are in the report's host_local: every other address went with its entry's DEL, or is
    kept for the runtime."""
    report = observed["reaper"]["report"]
    assert report is not None
    acted_on = {(r["network"], r["ip"]): r for r in report["host_local"]}
    orphans = [(s, a) for s, a in seen_with(observed) if a.results_file == "deleted"]
    assert set(acted_on) == {(a.network, ip) for s, a in orphans for ip in s["ips"]}
    for seen, a in orphans:
        for ip in seen["ips"]:
            r = acted_on[(a.network, ip)]
            assert (r["action"], r["outcome"], r["quarantined_to"]) == ("del", "done", None), r
            assert r["written"] == "previous-boot"
            owner_ifname = None if a.id_only_reservation else a.ifname
            assert r["owner"] == {"container_id": a.container_id, "ifname": owner_ifname}
            assert r["del"]["ifname"] == "eth0"
            assert r["del"]["ok"] is True
            assert sorted(r["del"]["released"]) == sorted(seen["ips"])
            if a.network == "gone-net":
                assert r["del"]["config"] == f"the config cached in {GONE_WHOLE.results_name}"
            else:
                assert r["del"]["config"].endswith(conf_file(a.network))
    assert {a.network for _, a in orphans} == {n["name"] for n in NETWORKS}


def test_the_reaper_released_every_address_but_those_kept_for_the_runtime(
    observed: Observed,
) -> None:
    after = reserved(observed, "after_repair")
    for seen, a in seen_with(observed):
        kept = a.results_file == "valid" and a.runtime_dels
        for ip in seen["ips"]:
            assert (ip in after[a.network]) is kept, (a, ip)
    # The reaper leaves host-local's last_reserved_ip files alone.
    for store in observed["stores"]:
        assert store["after_repair"]["last_reserved_ip"] == store["at_repair"]["last_reserved_ip"]


def test_the_pools_say_what_the_stores_show(observed: Observed) -> None:
    report = observed["reaper"]["report"]
    assert report is not None
    pools = pools_of(report)
    assert set(pools) == set(CAPACITY)
    before = count_by_set(reserved(observed, "at_repair"))
    left = count_by_set(reserved(observed, "after_repair"))
    for key, pool in pools.items():
        assert pool["capacity"] == CAPACITY[key], pool
        assert pool["reserved_before"] == before.get(key, 0), pool
        assert pool["left"] == left.get(key, 0), pool
        assert pool["released"] == pool["reserved_before"] - pool["left"], pool
        assert pool["left_by_owner"] == ({"runtime": pool["left"]} if pool["left"] else {})
        assert pool["free"] == pool["capacity"] - pool["left"]
    assert (pools[("gone-net", -1)]["released"], pools[("gone-net", -1)]["left"]) == (3, 0)


def test_a_network_gone_from_the_conf_dir_is_emptied_with_the_config_its_entries_cached(
    observed: Observed,
) -> None:
    report = observed["reaper"]["report"]
    assert report is not None
    entries = {e["path"]: e for e in report["entries"]}
    cached_in = f"the config cached in {GONE_WHOLE.results_name}"
    gone = [(s, a) for s, a in seen_with(observed) if a.network == "gone-net"]
    assert {a.results_file for _, a in gone} == {"empty", "valid", "deleted"}
    for seen, a in gone:
        if a.results_file != "deleted":
            entry = entries[a.results_name]
            assert (entry["outcome"], entry["del"]["config"]) == ("done", cached_in), entry
            assert sorted(entry["del"]["released"]) == sorted(seen["ips"])
        # The runtime has no config to DEL them with, as containerd's go-cni DELs only the
        # networks it loaded: only the reaper released them.
        assert seen["del_after"] is None
    assert reserved(observed, "at_repair")["gone-net"] != {}
    assert reserved(observed, "after_repair")["gone-net"] == {}


# ---- The runtime starts: new pods, and a later run ----------------------------------------------


def test_a_later_run_leaves_what_the_runtime_set_up_in_this_boot(observed: Observed) -> None:
    again = observed["reaper_again"]
    assert again is not None
    assert again["exit"] == 0, again["stderr"]
    report = again["report"]
    assert report is not None
    assert report["boot"]["pre_runtime_record"]["state"] == "loaded"
    entries = {e["path"]: e for e in report["entries"]}
    reservations = {(r["network"], r["ip"]): r for r in report["host_local"]}  # -v: kept too
    for seen, a in zip(observed["current_boot"], CURRENT_BOOT):
        entry = entries[a.results_name]
        assert (entry["written"], entry["action"], entry["outcome"]) == (
            "current-boot",
            "keep",
            "skipped",
        )
        for ip in seen["ips"]:
            r = reservations[(a.network, ip)]
            assert (r["written"], r["action"], r["outcome"]) == ("current-boot", "keep", "skipped")
    assert {e["action"] for e in report["entries"]} == {"keep"}
    assert {r["action"] for r in report["host_local"]} == {"keep"}
    # Nothing changed: the results files byte for byte, the stores, the quarantine.
    assert observed["results_after_second_run"] == observed["results_before_second_run"]
    assert reserved(observed, "after_second_run") == reserved(observed, "before_second_run")
    for a in CURRENT_BOOT:
        assert a.results_name in observed["results_after_second_run"]
    pools = pools_of(report)
    counts = count_by_set(reserved(observed, "after_second_run"))
    new = count_by_set(
        {
            a.network: dict.fromkeys(s["ips"], "")
            for s, a in zip(observed["current_boot"], CURRENT_BOOT)
        }
    )
    for key, pool in pools.items():
        assert (pool["reserved_before"], pool["released"], pool["left"]) == (
            counts[key],
            0,
            counts[key],
        )
        owners = {"current-boot": new.get(key, 0), "runtime": counts[key] - new.get(key, 0)}
        assert pool["left_by_owner"] == {k: n for k, n in owners.items() if n}


def test_new_pods_are_given_addresses_after_the_last_reserved_ones(observed: Observed) -> None:
    """The reaper freed the lower addresses but left last_reserved_ip alone: host-local goes on
    after the last address it handed out, in each range set."""
    ips = {a.network: s["ips"] for s, a in zip(observed["current_boot"], CURRENT_BOOT)}
    assert ips == {
        "bridge-net": ["10.88.0.8"],
        "dual-net": ["10.90.0.7", "fd90::7"],
        "multi-net": ["10.92.1.5", "10.93.0.7"],
    }


# ---- The runtime's DELs -------------------------------------------------------------------------


def test_after_the_repair_libcni_del_succeeds_and_the_stores_are_empty(
    observed: Observed,
) -> None:
    for seen, a in seen_with(observed):
        attempt = seen["del_after"]
        if not SCENARIO.runtime_dels_after(a):
            assert attempt is None
            continue
        assert attempt is not None
        assert attempt["ok"] is True, (seen["results_name"], attempt["error"], attempt["stderr"])
    for seen in observed["current_boot"]:
        assert seen["del_after"] is not None and seen["del_after"]["ok"] is True, seen
    assert reserved(observed, "after_runtime_del") == {s["network"]: {} for s in observed["stores"]}
    assert observed["results_after_runtime_del"] == []
    # The DNAT rules left are those of attachments no DEL with their port mappings reached:
    # orphans of forgotten sandboxes and the gone network's (a reboot drops them anyway).
    assert set(observed["dnat_rules_of"]["after_runtime_del"]) == {
        a.container_id
        for a in ATTACHMENTS
        if a.network in PORTMAP_NETWORKS
        and not is_forgotten_whole(a)
        and not SCENARIO.runtime_dels_after(a)
    }


# ---- A node with no runtime records -------------------------------------------------------------


def test_with_no_runtime_records_whole_entries_are_kept_and_orphans_released(
    played: dict[str, Observed],
) -> None:
    observed = played["no-records"]
    whole_forgotten, deleted, known = observed["attachments"]
    reaper = observed["reaper"]
    assert reaper["exit"] == 0, reaper["stderr"]
    report = reaper["report"]
    assert report is not None
    entries = {e["path"]: e for e in report["entries"]}
    kept = entries[whole_forgotten["results_name"]]
    assert (kept["action"], kept["outcome"]) == ("keep", "skipped")
    assert "no CRI runtime's sandbox records found on this node" in kept["reason"]
    assert entries[known["results_name"]]["action"] == "keep"
    (orphan,) = report["host_local"]
    assert (orphan["ip"], orphan["action"], orphan["outcome"]) == (deleted["ips"][0], "del", "done")
    assert reserved(observed, "after_repair")["bridge-net"] == {
        whole_forgotten["ips"][0]: f"{whole_forgotten['attachment']['container_id']}\r\neth0",
        known["ips"][0]: f"{known['attachment']['container_id']}\r\neth0",
    }
    # The runtime DELs what it knows; the sandbox it forgot keeps its address, as it would
    # with no reaper: with no records on the node nothing says it was forgotten.
    assert known["del_after"] is not None and known["del_after"]["ok"] is True
    assert whole_forgotten["del_after"] is None
    assert list(reserved(observed, "after_runtime_del")["bridge-net"]) == whole_forgotten["ips"]
