"""host-local's reservation store: addresses a crash left reserved to no one.

host-local keeps one file per reserved address, `<dataDir>/<network>/<ip>`, holding
`<containerID>\\r\\n<ifname>` (shared/reference/libcni-cache.md section 7), written without
fsync. A crash leaves some of them empty or NUL-filled. DEL releases an address by its owner's
container ID, so a reservation whose owner cannot be read is never released by anyone: its
address is gone from the pool for good. Every sandbox of an earlier boot died with it, so such
a file from an earlier boot is moved to the quarantine; from this boot, it is only reported.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import stat
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from cni_reaper.boot import BootContext, Written, WrittenVerdict, iso
from cni_reaper.filestat import FileStat
from cni_reaper.netconf import NetworkConfigs
from cni_reaper.node_root import LeavesRoot, host_path, resolve_inside
from cni_reaper.pre_runtime import Proof
from cni_reaper.trust import untrusted

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
MAX_RESERVATION_BYTES = 4096


class Reservation(NamedTuple):
    network: str
    store: str  # the network's store dir
    ip: str
    file: FileStat
    content: str  # valid, empty, zeroed, garbage
    written: WrittenVerdict
    action: str  # keep, quarantine, leave
    reason: str

    def to_json(self, outcome: str, quarantined_to: str | None = None) -> dict[str, Any]:
        return {
            "network": self.network,
            "path": os.path.join(self.store, self.ip),
            "ip": self.ip,
            "size": self.file.size,
            "mtime": iso(self.file.mtime),
            "ctime": iso(self.file.ctime),
            "content": self.content,
            "written": self.written.written.value,
            "evidence": self.written.evidence,
            "action": self.action,
            "reason": self.reason,
            "outcome": outcome,
            "quarantined_to": quarantined_to,
        }


def _data_dirs(configs: NetworkConfigs) -> Iterator[tuple[str, str]]:
    """(network, host-local's dataDir as the node names it) of every network whose chain uses
    host-local: as the plugin, run from /, sees it, ".." never above "/"."""
    for name, netlist in sorted(configs.networks.items()):
        for plugin in netlist.plugins:
            ipam = plugin.get("ipam")
            if isinstance(ipam, dict) and ipam.get("type") == "host-local":
                data_dir = ipam.get("dataDir")
                data_dir = data_dir if isinstance(data_dir, str) and data_dir else DEFAULT_DATA_DIR
                yield name, os.path.normpath("/" + data_dir.lstrip("/"))
                break


def _store_node_paths(configs: NetworkConfigs) -> Iterator[tuple[str, str]]:
    """(network, its store as the node names it): <dataDir>/<network>."""
    for name, data_dir in _data_dirs(configs):
        if "/" in name or name in (".", ".."):
            continue  # not a dir of the store, whatever a config says (libcni forbids it)
        yield name, os.path.join(data_dir, name)


def stores(configs: NetworkConfigs, root: str) -> Iterator[tuple[str, str]]:
    """(network, store dir) of every network whose chain uses host-local, under root: as the
    node resolves it, its symlinks never leading out of the root."""
    for name, node_path in _store_node_paths(configs):
        if root == "/":
            yield name, node_path
            continue
        try:
            yield name, resolve_inside(root, node_path)
        except (LeavesRoot, OSError):
            continue  # no store of the node's there; store_problems() says why


def store_problems(configs: NetworkConfigs, root: str) -> dict[str, str]:
    """Networks whose store, under a root other than /, is reached through a symlink: the
    plugins run confined to the root's dirs (confine.py), but a symlink below them is followed
    there as on this machine, to this machine's files. Their DEL is not run."""
    if root == "/":
        return {}
    problems = {}
    for name, node_path in _store_node_paths(configs):
        plain = host_path(root, node_path)
        try:
            resolved = resolve_inside(root, node_path)
        except (LeavesRoot, OSError) as e:
            resolved = str(e)
        if resolved != plain:
            problems[name] = (
                f"host-local's store {plain} is reached through a symlink in the root: a plugin "
                "would follow it to this machine's own files, so no DEL of this network runs"
            )
    return problems


class Releases:
    """What host-local held for each attachment before its DEL, to see after the DEL that it
    was released: the one effect of a DEL the reaper can check. A DEL that exits 0 and leaves
    the address reserved is a failure, never done.

    A store is read once, before its network's first DEL (DELs of one network never run at
    once, so its entry is never shared between workers). host-local releases by owner: a file
    whose trimmed content is '<container id>\\r\\n<ifname>', or the container ID alone, as
    stores before plugins v0.8.0 wrote it (shared/reference/libcni-cache.md section 7)."""

    def __init__(self, stores: Iterable[tuple[str, str]]) -> None:
        self._stores = dict(stores)  # network -> its store dir
        self._owners: dict[str, dict[str, list[str]]] = {}  # network -> owner -> addresses

    def store(self, network: str) -> str | None:
        return self._stores.get(network)

    def held_by(self, network: str, container_id: str, ifname: str) -> tuple[str, ...]:
        """The addresses the store holds for this attachment, as it was before any DEL of
        the network ran in this run."""
        store = self._stores.get(network)
        if store is None:
            return ()
        owners = self._owners.get(network)
        if owners is None:
            owners = self._owners[network] = _owners(store)
        return (*owners.get(f"{container_id}\r\n{ifname}", ()), *owners.get(container_id, ()))

    def still_held(
        self, network: str, container_id: str, ifname: str, addresses: Iterable[str]
    ) -> list[str]:
        """Of addresses, those the store still holds for this attachment."""
        store = self._stores[network]
        owner = (f"{container_id}\r\n{ifname}".encode(), container_id.encode())
        return [ip for ip in addresses if _read_reservation(store, ip).strip() in owner]


def _owners(store: str) -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    try:
        names = os.listdir(store)
    except OSError:
        return owners
    for name in names:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            continue  # lock, last_reserved_ip.N
        owner = _read_reservation(store, name).strip()
        if owner:
            owners.setdefault(owner.decode("utf-8", "replace"), []).append(name)
    return owners


def _read_reservation(store: str, name: str) -> bytes:
    """A reservation's bytes, b"" if it is gone; never through a symlink."""
    try:
        fd = os.open(os.path.join(store, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_RESERVATION_BYTES)


def _content(data: bytes) -> str:
    if not data:
        return "empty"
    if not data.strip(b"\0"):
        return "zeroed"
    owner = data.split(b"\r\n", 1)[0].split(b"\n", 1)[0]
    if b"\0" in data or not owner.strip() or any(c < 0x21 or c > 0x7E for c in owner):
        return "garbage"
    return "valid"


def data_dirs(configs: NetworkConfigs) -> set[str]:
    """Every host-local dataDir the network configs use, as absolute node paths (the default
    among them, which lies under a standard bind target of confine.py)."""
    return {data_dir for _, data_dir in _data_dirs(configs)}


def inventory(network: str, store: str, boot: BootContext, proof: Proof) -> Iterator[Reservation]:
    """The reservations of one store that are not plainly valid; never through a symlink.
    When each was written is the pre-runtime record's to say (pre_runtime.py)."""
    try:
        dir_fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        dir_st = os.fstat(dir_fd)
        if untrusted(dir_st):
            return
        proof.open_dir(store, dir_st)
        for name in sorted(os.listdir(dir_fd)):
            try:
                ipaddress.ip_address(name)
            except ValueError:
                continue  # lock, last_reserved_ip.N
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RESERVATION_BYTES:
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                content = _content(f.read(MAX_RESERVATION_BYTES))
            if content == "valid":
                continue
            file = FileStat.of(st)
            written = proof.written(store, name, file, boot.classify(file.mtime, file.ctime))
            if written.written is Written.PREVIOUS_BOOT:
                action = "quarantine"
                reason = "no owner to release it, and every sandbox of that boot is gone"
            else:
                action = "leave"
                reason = f"written {written.written.value}: may be a reservation in flight"
            yield Reservation(
                network,
                store,
                name,
                file,
                content,
                written,
                action,
                reason,
            )
    finally:
        os.close(dir_fd)


class StoreLock:
    """host-local's own lock on the store, so no plugin reserves while a file is moved."""

    def __init__(self, store: str) -> None:
        self._fd = os.open(
            os.path.join(store, "lock"),
            os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.dir_fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self.dir_fd)
        os.close(self._fd)


def settle(
    reservations: list[Reservation], dry_run: bool, quarantine_dir: str, boot_id: str, now: float
) -> Iterator[tuple[Reservation, str, str | None, str | None]]:
    """Yields (reservation, outcome, where it went, what went wrong) for each: those to leave
    are skipped, a dry run plans, a real run moves to quarantine/<boot>/host-local/<network>/
    under host-local's own lock."""
    to_move = []
    for reservation in reservations:
        if reservation.action == "leave":
            yield reservation, "skipped", None, None
        elif dry_run:
            yield reservation, "planned", None, None
        else:
            to_move.append(reservation)
    if to_move:
        yield from _quarantine(to_move, quarantine_dir, boot_id, now)


def _quarantine(
    reservations: list[Reservation], quarantine_dir: str, boot_id: str, now: float
) -> Iterator[tuple[Reservation, str, str | None, str | None]]:
    from cni_reaper.quarantine import (  # noqa: PLC0415 (only real runs move files)
        FileChanged,
        Move,
        Quarantine,
        QuarantineError,
        sidecar,
    )

    by_store: dict[str, list[Reservation]] = {}
    for reservation in reservations:
        by_store.setdefault(reservation.store, []).append(reservation)
    for store, items in by_store.items():
        network = items[0].network
        place = Quarantine(os.path.join(quarantine_dir, boot_id, "host-local"), network)
        try:
            lock = StoreLock(store)
        except OSError as e:
            for reservation in items:
                yield reservation, "failed", None, f"cannot lock {store}: {e.strerror}"
            continue
        try:
            for reservation in items:

                def record(dest: str, sha256: str, r: Reservation = reservation) -> dict[str, Any]:
                    return sidecar(r.to_json("done", dest), sha256, now)

                def vet(data: bytes, judged: str = reservation.content) -> str | None:
                    found = _content(data)
                    return None if found == judged else f"now {found}, was {judged}"

                move = Move(lock.dir_fd, reservation.ip, reservation.file, record, vet)
                try:
                    dest = place.move(move)
                except FileChanged as e:
                    yield reservation, "skipped", None, f"changed: {e}; left for the next run"
                except (QuarantineError, OSError) as e:
                    yield reservation, "failed", None, f"quarantine: {e.strerror or e}"
                else:
                    yield reservation, "done", dest, None
        finally:
            place.close()
            lock.close()
