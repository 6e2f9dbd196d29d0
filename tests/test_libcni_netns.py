"""The seed bug with the real libcni, and its repair: attachments made and torn down by libcni
1.1.2 itself (tests/libcni_client) through Debian's bridge, ptp, host-local and portmap, in a
private network and mount namespace (tests/libcni_scenario.py).

Before the repair, the runtime's DEL of every attachment whose results file the crash damaged
fails with the seed error and runs no plugin; after cni-reaper, the runtime's DEL succeeds for
every attachment and no host-local store holds a reservation. The networks cover IPv4, IPv6 and
dual-stack ranges, several ranges and range sets, dataDirs inside and outside /var/lib/cni,
reservations in the ID-only format, one container on two networks, a results file deleted
outright, and conflists of cniVersion 0.4.0 and 1.0.0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from tests.libcni_scenario import (
    DAMAGED,
    Attachment,
    Observed,
    Scenario,
    bridge_network,
    ptp_network,
    run_in_namespace,
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
)

_ids = iter(CONTAINER_IDS)
TWO_NETWORKS = next(_ids)  # one pod on bridge-net (eth0) and ptp-net (net1), as with multus
ATTACHMENTS = (
    Attachment("bridge-net", TWO_NETWORKS, "eth0", "empty"),
    Attachment("ptp-net", TWO_NETWORKS, "net1", "valid"),
    Attachment("bridge-net", next(_ids), results_file="zeroed", id_only_reservation=True),
    Attachment("bridge-net", next(_ids), results_file="truncated"),
    Attachment("bridge-net", next(_ids), results_file="valid"),
    Attachment("ptp-net", next(_ids), results_file="truncated", id_only_reservation=True),
    Attachment("ptp-net", next(_ids), results_file="empty"),
    Attachment("ptp-net", next(_ids), results_file="deleted"),
    Attachment("dual-net", next(_ids), results_file="empty"),
    Attachment("dual-net", next(_ids), results_file="zeroed", id_only_reservation=True),
    Attachment("dual-net", next(_ids), results_file="valid"),
    Attachment("v6-net", next(_ids), results_file="truncated"),
    Attachment("v6-net", next(_ids), results_file="valid"),
    Attachment("multi-net", next(_ids), results_file="empty"),
    Attachment("multi-net", next(_ids), results_file="valid"),
    Attachment("multi-net", next(_ids), results_file="truncated", id_only_reservation=True),
)
SCENARIO = Scenario(networks=NETWORKS, attachments=ATTACHMENTS)


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, libcni_client: LibcniClient) -> Observed:
    reason = why_not()
    if reason:
        cannot_run(reason)
    return run_in_namespace(SCENARIO, libcni_client, tmp_path_factory.mktemp("libcni-netns"))


Stage = Literal["before_crash", "at_repair", "after_repair", "after_runtime_del"]


def reserved(observed: Observed, stage: Stage) -> dict[str, dict[str, str]]:
    """Per network, its store's reservations at a stage."""
    return {s["network"]: dict(s[stage]["reservations"]) for s in observed["stores"]}


def test_libcni_made_every_attachment_through_the_real_plugins(observed: Observed) -> None:
    before = reserved(observed, "before_crash")
    for seen, a in zip(observed["attachments"], ATTACHMENTS):
        assert seen["add"]["ok"], seen["add"]["error"]
        owner = a.container_id if a.id_only_reservation else f"{a.container_id}\r\n{a.ifname}"
        assert seen["ips"]
        for ip in seen["ips"]:
            assert before[a.network][ip] == owner
    assert len({ip for s in observed["attachments"] for ip in s["ips"]}) == sum(
        len(s["ips"]) for s in observed["attachments"]
    )
    # The crash took every link the attachments made, as a reboot does.
    assert observed["links_left_by_crash"] == []


def test_the_ranges_were_really_used(observed: Observed) -> None:
    by_network: dict[str, list[str]] = {a.network: [] for a in ATTACHMENTS}
    for seen, a in zip(observed["attachments"], ATTACHMENTS):
        by_network[a.network] += seen["ips"]
    assert all(":" not in ip for ip in by_network["bridge-net"])
    dual = by_network["dual-net"]
    assert len([ip for ip in dual if ":" in ip]) == len([ip for ip in dual if ":" not in ip]) == 3
    assert all(ip.startswith("fd91:") for ip in by_network["v6-net"])
    multi = sorted(by_network["multi-net"])
    assert multi == sorted(
        ["10.92.0.10", "10.92.0.11", "10.92.1.2", "10.93.0.2", "10.93.0.3", "10.93.0.4"]
    )
    stores = {s["network"]: s for s in observed["stores"]}
    assert stores["dual-net"]["path"] == f"{OUTSIDE_DATA_DIR}/dual-net"
    assert stores["multi-net"]["path"] == f"{INSIDE_DATA_DIR}/multi-net"
    assert set(stores["multi-net"]["before_crash"]["last_reserved_ip"]) == {
        "last_reserved_ip.0",
        "last_reserved_ip.1",
    }


def test_before_the_repair_libcni_del_fails_with_the_seed_error(observed: Observed) -> None:
    tried = 0
    for seen, a in zip(observed["attachments"], ATTACHMENTS):
        if a.results_file in DAMAGED:
            tried += 1
            attempt = seen["del_before"]
            assert attempt is not None
            assert attempt["ok"] is False
            assert attempt["error"] == seed_error(a.network, a.results_file)
        else:
            assert seen["del_before"] is None
    assert tried == 10
    # The failing DELs ran no plugin: every address is still reserved.
    assert reserved(observed, "at_repair") == reserved(observed, "before_crash")


def test_the_reaper_repairs_and_exits_0(observed: Observed) -> None:
    reaper = observed["reaper"]
    assert reaper["exit"] == 0, reaper["stderr"]
    assert reaper["report"] is not None
    entries = {e["path"]: e for e in reaper["report"]["entries"]}
    for a in ATTACHMENTS:
        if a.results_file == "deleted":
            assert a.results_name not in entries
            continue
        entry = entries[a.results_name]
        if a.results_file == "valid":
            assert (entry["action"], entry["outcome"]) == ("keep", "skipped")
        else:
            assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
    damaged = {a.results_name for a in ATTACHMENTS if a.results_file in DAMAGED}
    assert set(observed["results_after_repair"]) == {
        a.results_name for a in ATTACHMENTS if a.results_file == "valid"
    }
    assert {
        q.split("/", 1)[1] for q in observed["quarantine"] if not q.endswith(".json")
    } == damaged


def test_the_reaper_released_what_the_damaged_and_orphaned_attachments_held(
    observed: Observed,
) -> None:
    """Damaged entries by their DEL; an address whose results file is gone as an orphan."""
    after = reserved(observed, "after_repair")
    for seen, a in zip(observed["attachments"], ATTACHMENTS):
        for ip in seen["ips"]:
            if a.results_file in DAMAGED or a.results_file == "deleted":
                assert ip not in after[a.network], (a, ip)
            else:
                assert ip in after[a.network], (a, ip)


def test_after_the_repair_libcni_del_succeeds_and_the_stores_are_empty(
    observed: Observed,
) -> None:
    for seen in observed["attachments"]:
        attempt = seen["del_after"]
        assert attempt is not None
        assert attempt["ok"] is True, (seen["results_name"], attempt["error"], attempt["stderr"])
    assert reserved(observed, "after_runtime_del") == {s["network"]: {} for s in observed["stores"]}
    assert observed["results_after_runtime_del"] == []


# A sandbox the runtime forgot whose results file is gone (the rm -rf peers, a crash between
# host-local's reservation and libcni's cache write): nobody but the reaper will ever DEL it.
FORGOTTEN = Scenario(
    networks=(NETWORKS[0],),
    attachments=(
        Attachment("bridge-net", CONTAINER_IDS[20], results_file="deleted", runtime_dels=False),
        Attachment("bridge-net", CONTAINER_IDS[21], results_file="valid"),
    ),
)


def test_an_orphaned_reservation_is_released_by_the_reaper(
    tmp_path: Path, libcni_client: LibcniClient
) -> None:
    reason = why_not()
    if reason:
        cannot_run(reason)
    observed = run_in_namespace(FORGOTTEN, libcni_client, tmp_path)
    forgotten, known = observed["attachments"]
    assert forgotten["del_before"] is None
    assert forgotten["del_after"] is None
    assert known["del_after"] is not None
    assert known["del_after"]["ok"] is True
    assert observed["reaper"]["exit"] == 0, observed["reaper"]["stderr"]
    assert reserved(observed, "after_repair")["bridge-net"] == {
        ip: f"{CONTAINER_IDS[21]}\r\neth0" for ip in known["ips"]
    }
