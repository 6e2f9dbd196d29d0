"""Attacks on Multus's `cniDir` (cni_reaper/multus.py named_dirs, MultusCache.named; cli.py
_Delegates): what a Multus config in the conf dirs may name, as an attacker or an unlucky
operator would have it, and what the reaper then inspects, moves and keeps. A delegate is ADDed
by the real libcni (tests/libcni_client) with the cache dir Multus would give it, and real
host-local. The first eight scenarios were defects of the change as first made (strict
xfails, found by an attack review on 2026-12-06), mended since; the second is now kept as
doubt has it (tests/test_multus_cni_dir_review.py says why)."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from cni_reaper.repair import multus_repair
from tests.crashed import Crashed
from tests.meta_db_running import Interfere
from tests.nodetree import CONTAINER_IDS, snapshot
from tests.private_node import damage
from tests.real_libcni import LibcniClient
from tests.test_multus import BOOT_ID, KNOWN, MultusNode, delegates
from tests.test_multus_cni_dir import multus_conf, the_reservation, warned

OTHER = KNOWN.replace("1", "3")  # a second sandbox's container ID, 64 hex


def multus_at(
    crashed: Crashed,
    client: LibcniClient,
    conf: dict[str, Any],
    cached_in: str | None = None,
    file_name: str = "00-multus.conf",
) -> MultusNode:
    """A Multus config written as given; its delegates cached in cached_in (a node path)."""
    crashed.node.write_conf(file_name, json.dumps(conf).encode())
    node = MultusNode(crashed, client)
    if cached_in is not None:
        node.cache_dir = crashed.node.root / cached_in.lstrip("/")
    return node


def named(conf_name: str, kind: str, cni_dir: object) -> dict[str, Any]:
    """multus_conf under another network name, so that several can be loaded at once."""
    conf = multus_conf(kind, cni_dir)
    conf["name"] = conf_name
    return conf


def orphan_of_a_known_pod(node: MultusNode) -> None:
    """A pod containerd knows, set up through Multus, whose delegate's result was never cached
    (the node died between host-local's reservation and libcni's cache write): no results
    entry, no Multus cache entry; then the reboot."""
    result = node.delegate(KNOWN)
    result.unlink()
    node.containerd_knows(KNOWN)
    node.crashed.reboot()


def reasons(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["action"], r["reason"]) for r in report["host_local"]]


# --- defects of the first version, mended ---------------------------------------------------


def test_a_null_cni_dir_is_multus_default_and_an_orphan_is_still_released(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    node = multus_at(crashed, libcni_client, multus_conf("multus", None) | {"cniDir": None})
    orphan_of_a_known_pod(node)

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert not warned(report, "cniDir"), report["warnings"]
    # as with no cniDir at all (the default place, holding no result for it): an orphan
    assert the_reservation(report)["action"] == "del", reasons(report)
    assert crashed.ips() == {}


def test_cni_dir_var_lib_cni_keeps_the_address_for_multus_and_says_why(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multus with cniDir /var/lib/cni keeps its scratch files beside the runtime's dirs and
    its delegates' results among the runtime's entries: the dir is not inspected as Multus's,
    and the address of a sandbox with no entry stays Multus's to release (the review found
    every such orphan kept with a reason saying the runtime's results dir was not looked at;
    it is kept still, as doubt has it, and the reason says why)."""
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/var/lib/cni"))
    orphan_of_a_known_pod(node)

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    reservation = the_reservation(report)
    results_dir = str(crashed.node.results)
    assert (
        f"{results_dir}, as a Multus config names it; not looked at" not in (reservation["reason"])
    )
    assert "it is or holds a dir this run inspects as the runtime's" in reservation["reason"]
    assert reservation["action"] == "keep", reservation["reason"]


def test_a_cni_dir_in_the_quarantine_never_moves_the_quarantines_own_files(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    old_boot = crashed.node.quarantine / "00000000-0000-0000-0000-000000000000" / "multus"
    old_boot.mkdir(parents=True, mode=0o700)
    kept = old_boot / KNOWN  # a damaged scratch file an earlier boot's run moved here
    kept.write_bytes(b"")
    sidecar = old_boot / f"{KNOWN}.json"
    sidecar.write_text(json.dumps({"path": f"/var/lib/cni/multus/{KNOWN}", "outcome": "done"}))
    node_path = "/" + str(old_boot.relative_to(crashed.node.root))
    multus_at(crashed, libcni_client, multus_conf("multus", node_path))
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert kept.exists(), report["multus_scratch"]
    assert not (crashed.node.quarantine / BOOT_ID).exists()
    assert report["multus_scratch"] == []
    assert code == ExitCode.OK, report


@pytest.mark.parametrize("key", ["cnidir", "CNIDir"])
def test_a_cni_dir_key_in_another_case_is_the_one_multus_uses(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    conf = multus_conf("multus", None) | {key: "/srv/multus"}
    node = multus_at(crashed, libcni_client, conf, "/srv/multus")
    result = node.crash_damages_a_known_pods_delegate("empty")
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert [d["path"] for d in report["multus_results"]] == [str(result)]
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert crashed.ips() == held


def test_hundreds_of_multus_networks_do_not_starve_the_default_caches_repair(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    root = crashed.node.root
    for i in range(600):
        where = f"/srv/multus/{i}"
        (root / where.lstrip("/") / "results").mkdir(parents=True)
        conf = named(f"multus-{i}", "multus", where)
        crashed.node.write_conf(f"05-multus-{i:04}.conf", json.dumps(conf).encode())
    node = multus_at(crashed, libcni_client, multus_conf("multus", None))
    result = node.crash_damages_a_known_pods_delegate("empty")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))  # systemd's default
    try:
        code = crashed.run_main()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    report = json.loads(capsys.readouterr().out)

    doc = delegates(report)[result.name]
    assert (doc["outcome"], doc["problem"]) == ("done", None), doc
    assert not warned(report, "Too many open files")
    assert code == ExitCode.OK


def test_a_var_run_that_is_a_directory_is_not_taken_for_run(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    root = crashed.node.root
    (root / "var/run").mkdir(parents=True)
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/var/run/multus"))
    node.cache_dir = root / "var/run/multus"
    result = node.delegate(KNOWN)  # whole: Multus's DEL will use it
    node.containerd_knows(KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert result.exists()


def test_a_non_string_cni_dir_puts_no_made_up_path_in_the_reason(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    node = multus_at(crashed, libcni_client, multus_conf("multus", 7))
    orphan_of_a_known_pod(node)

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    reservation = the_reservation(report)
    assert reservation["action"] == "keep"
    conf_file = crashed.node.conf_dir / "00-multus.conf"
    assert f"{conf_file}: cniDir/results" not in reservation["reason"], reservation["reason"]


def test_the_quarantine_is_read_once_per_run_not_once_per_named_dir(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    real = multus_repair.moved_earlier

    def counted(
        quarantine_dir: str, on_doubt: Callable[[str], None] | None = None
    ) -> dict[str, frozenset[str]] | None:
        reads.append(quarantine_dir)
        return real(quarantine_dir, on_doubt)

    monkeypatch.setattr(multus_repair, "moved_earlier", counted)
    root = crashed.node.root
    for i in range(5):
        (root / f"srv/multus/{i}/results").mkdir(parents=True)
        conf = named(f"multus-{i}", "multus", f"/srv/multus/{i}")
        crashed.node.write_conf(f"0{i}-multus.conf", json.dumps(conf).encode())
    crashed.add(CONTAINER_IDS[1])
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK, report
    assert len(reads) <= 1, reads


# --- what held ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cni_dir",
    [
        "/var/lib/cni/networks/hl",  # host-local's store of the network
        "/etc/cni/net.d",  # the conf dir
        "/proc",
        "/run",
        "/",
        "/var/lib/cni-reaper",  # the reaper's own state dir
        "/var/lib/cni/results",  # the runtime's results dir itself
    ],
)
def test_a_cni_dir_naming_a_place_that_is_not_multus_moves_nothing_there(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str], cni_dir: str
) -> None:
    """No 64-hex file and no `results` of Multus's there: nothing is judged as Multus's, the
    runtime's entry and its reservation fare as without the config."""
    multus_at(crashed, libcni_client, multus_conf("multus", cni_dir))
    entry = crashed.add(CONTAINER_IDS[1])
    crashed.reboot()
    held = crashed.ips()
    place = crashed.node.root / cni_dir.lstrip("/")
    before = snapshot(place) if cni_dir not in ("/", "/run", "/var/lib/cni-reaper") else None

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert report["multus_results"] == [] and report["multus_scratch"] == []
    assert [(e["path"], e["action"]) for e in report["entries"]] == [(entry.name, "keep")]
    assert the_reservation(report)["action"] == "keep"
    assert crashed.ips() == held and entry.exists()
    assert not (crashed.node.quarantine / BOOT_ID).exists()
    if before is not None:
        assert snapshot(place) == before


def test_a_symlink_swapped_during_the_run_moves_only_from_the_dir_that_was_judged(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    after_each_read: Interfere,
) -> None:
    root = crashed.node.root
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/var/lib/cni/mlink"), "/srv/a")
    judged = node.delegate(KNOWN)
    damage(judged, "empty")
    other = root / "srv/b/results" / judged.name
    other.parent.mkdir(parents=True)
    other.write_bytes(b"")
    link = root / "var/lib/cni/mlink"
    link.symlink_to("/srv/a")
    node.containerd_knows(KNOWN)
    crashed.reboot()

    def swap(_: int) -> None:
        link.unlink()
        link.symlink_to("/srv/b")

    reads = after_each_read(swap)  # containerd's meta.db is read after the caches are opened
    code, report = crashed.run(capsys, "-v")

    assert reads, "the swap never ran"
    assert code == ExitCode.OK, report
    assert [(d["path"], d["outcome"]) for d in report["multus_results"]] == [(str(judged), "done")]
    assert not judged.exists() and other.exists()
    assert the_reservation(report)["action"] == "keep"


def test_dot_dot_through_a_symlink_is_taken_as_go_cleans_it(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multus joins the dir with filepath.Join, and libcni its results dir too: both clean
    `hop/..` away lexically, whatever hop links to."""
    root = crashed.node.root
    node = multus_at(
        crashed, libcni_client, multus_conf("multus", "/var/lib/hop/../mc"), "/var/lib/mc"
    )
    (root / "srv/deep/x").mkdir(parents=True)
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/hop").symlink_to("/srv/deep/x")
    result = node.crash_damages_a_known_pods_delegate("empty")
    decoy = root / "srv/deep/mc/results" / result.name  # where the kernel's walk would lead
    decoy.parent.mkdir(parents=True)
    decoy.write_bytes(b"")

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert [d["path"] for d in report["multus_results"]] == [str(result)]
    assert not result.exists() and decoy.exists()


def test_an_absolute_symlink_on_a_rescue_root_stays_inside_the_root(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """The node's /srv/m -> /data/m is the root's data/m; a link to this machine's own path
    is the root's too, where nothing is."""
    root = crashed.node.root
    outside = tmp_path / "machine"
    (outside / "results").mkdir(parents=True)
    victim = outside / "results" / f"hl-{OTHER}-eth0"
    victim.write_bytes(b"")
    multus_at(crashed, libcni_client, named("machine", "multus", "/srv/away"), None, "01-m.conf")
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/srv/m"), "/data/m")
    (root / "srv").mkdir(parents=True, exist_ok=True)
    (root / "srv/m").symlink_to("/data/m")
    (root / "srv/away").symlink_to(str(outside))
    result = node.crash_damages_a_known_pods_delegate("empty")

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert [d["path"] for d in report["multus_results"]] == [str(result)]
    assert not result.exists() and victim.exists()


@pytest.mark.parametrize("outer_first", [True, False])
def test_dirs_nested_in_each_other_are_each_judged_once(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    outer_first: bool,
) -> None:
    """One config names /srv/m, another /srv/m/results (the first one's results dir): each
    file is judged at most once, and never by both caches."""
    root = crashed.node.root
    outer = named("outer", "multus", "/srv/m")
    inner = named("inner", "multus", "/srv/m/results")
    first, second = (outer, inner) if outer_first else (inner, outer)
    multus_at(crashed, libcni_client, first, None, "00-a.conf")
    node = multus_at(crashed, libcni_client, second, "/srv/m", "01-b.conf")
    result = node.delegate(KNOWN)
    damage(result, "empty")
    (root / "srv/m/results" / OTHER).write_bytes(b"")  # the inner one's scratch file
    node.containerd_knows(KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys, "--dry-run")

    assert warned(report, "is or holds a dir this run inspects as the runtime's or another")
    paths = [d["path"] for d in report["multus_results"] + report["multus_scratch"]]
    assert len(paths) == len(set(paths)), paths
    assert code in (ExitCode.OK, ExitCode.DATA), report


def test_a_nul_in_cni_dir_is_no_internal_error(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/srv/multus\u0000x"))
    node.crash_damages_a_known_pods_delegate("empty")
    held = crashed.ips()

    code = crashed.run_main("-v")
    report = json.loads(capsys.readouterr().out)

    assert code == ExitCode.OK, report
    assert warned(report, "a NUL in the path"), report["warnings"]
    assert the_reservation(report)["action"] == "keep"
    assert crashed.ips() == held


def test_a_second_run_in_the_boot_still_leaves_the_address_to_multus(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run moved the damaged delegate result out of the named dir (through a
    symlink); the second finds it gone, and knows from the quarantine that Multus's DEL still
    comes for the address."""
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/var/lib/cni/mlink"), "/srv/a")
    (crashed.node.root / "var/lib/cni").mkdir(parents=True, exist_ok=True)
    (crashed.node.root / "var/lib/cni/mlink").symlink_to("../../../srv/a")
    moved_then_kept_by_a_second_run(node, capsys)


def moved_then_kept_by_a_second_run(node: MultusNode, capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged delegate result of a known pod, moved by a run; a second run in the boot
    keeps its address for Multus's DEL, knowing the move from the quarantine."""
    crashed = node.crashed
    result = node.crash_damages_a_known_pods_delegate("truncated")
    held = crashed.ips()

    code, report = crashed.run(capsys)
    assert code == ExitCode.OK, report
    assert not result.exists()
    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert crashed.ips() == held


def test_the_same_dir_named_through_two_symlinks_is_judged_once(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    root = crashed.node.root
    multus_at(crashed, libcni_client, named("again", "multus", "/srv/l2/"), None, "01-m.conf")
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/srv/l1"), "/srv/real")
    result = node.delegate(KNOWN)
    damage(result, "zeroed")
    (root / "srv/l1").symlink_to("real")
    (root / "srv/l2").symlink_to("/srv/l1")
    node.containerd_knows(KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK, report
    assert [(d["path"], d["outcome"]) for d in report["multus_results"]] == [(str(result), "done")]
    assert sorted(os.listdir(node.quarantine)) == [result.name, f"{result.name}.json"]
