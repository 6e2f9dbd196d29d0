"""The results cache directory: a read-only inventory, one CacheEntry per directory entry.

The directory is opened once without following symlinks and every entry is looked at through
that descriptor, so nothing outside it is ever read and no FIFO is ever opened.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Collection, Iterable, Iterator

from cni_reaper import content, leaving
from cni_reaper.content import Content, ContentVerdict, Identity
from cni_reaper.filestat import UNKNOWN_FILE, FileStat
from cni_reaper.record import Record
from cni_reaper.trust import untrusted
from cni_reaper.unopened import DIR_FLAGS, READ_FLAGS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_ID_THEN_IFNAME = re.compile(r"([0-9a-f]{64})-(.+)\Z")


class ResultsDirError(OSError):
    """The results dir cannot be inspected safely (a symlink, not a dir, unreadable)."""


_VALID = ContentVerdict(Content.VALID, content.CACHE_KIND)  # its names are the entry's split


class CacheEntry(Record):
    name: str  # the file name, relative to the results dir
    file: FileStat
    verdict: ContentVerdict
    split: Identity | None
    name_problem: str | None

    @property
    def content(self) -> Content:
        return self.verdict.content


def is_container_id(name: str) -> bool:
    """Whether name is a container ID as containerd and CRI-O make them: 64 hex digits."""
    return _CONTAINER_ID.fullmatch(name) is not None


def _split_rest(rest: str) -> list[tuple[str, str]]:
    """The ways '<containerID>-<ifname>' can be read; one when it is unambiguous."""
    match = _ID_THEN_IFNAME.match(rest)
    if match:
        return [(match.group(1), match.group(2))]
    parts = rest.split("-")
    return [("-".join(parts[:i]), "-".join(parts[i:])) for i in range(1, len(parts))]


def split_name(name: str, networks: Collection[str]) -> tuple[Identity | None, str | None]:
    """Split '<network>-<containerID>-<ifname>' using the known network names.

    Any of the three may contain '-', so a name is split only when exactly one reading exists:
    a known network as the prefix, then a 64-hex container ID (preferred) or any '-'. A name
    of no known network is split only around a single 64-hex container ID.
    """
    prefixed = [network for network in networks if network and name.startswith(network + "-")]
    if len(prefixed) == 1:
        # The common case, read at once: one known network, then a 64-hex ID (the reading
        # below would be this one alone).
        match = _ID_THEN_IFNAME.match(name, len(prefixed[0]) + 1)
        if match:
            return Identity(prefixed[0], match.group(1), match.group(2)), None
    readings: set[tuple[str, str, str]] = set()
    for network in prefixed:
        for container_id, ifname in _split_rest(name[len(network) + 1 :]):
            readings.add((network, container_id, ifname))
    if not readings:
        for match in _CONTAINER_ID.finditer(name):
            start, end = match.span()
            dashed = start > 1 and name[start - 1] == "-" and name[end : end + 1] == "-"
            if dashed and end + 1 < len(name):
                readings.add((name[: start - 1], match.group(), name[end + 1 :]))
    # containerd and CRI-O use 64-hex IDs: a reading with one beats readings without.
    hex_readings = {r for r in readings if _CONTAINER_ID.fullmatch(r[1])}
    if hex_readings:
        readings = hex_readings
    if len(readings) == 1:
        network, container_id, ifname = readings.pop()
        return Identity(network, container_id, ifname), None
    if not readings:
        return None, "no known network name and no 64-hex container ID in the name"
    choices = "; ".join(
        f"network {n!r} container {c!r} ifname {i!r}" for n, c, i in sorted(readings)
    )
    return None, f"ambiguous name: {choices}"


def _not_a_file(dir_fd: int, name: str, file: FileStat) -> str:
    """What it is, and for a symlink where it points (read, never followed: libcni would
    follow it), so that an operator can tell what to remove by hand."""
    if file.kind != "symlink":
        return f"a {file.kind}; never opened"
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "a symlink; never followed"
    shown = target if len(target) <= 256 else target[:256] + "…"
    return f"a symlink to {shown}; never followed (libcni would read what it points to)"


def _inspect(
    dir_fd: int,
    name: str,
    regular: bool,
    judge: Callable[[bytes], ContentVerdict | Identity] = content.judge,
) -> tuple[FileStat, ContentVerdict | Identity] | None:
    """The file's stat and what judge (a results entry's, unless said) makes of its bytes,
    None if it was removed since the listing. A non-file is only looked at, never opened."""
    if not regular:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as e:
            return UNKNOWN_FILE, ContentVerdict(Content.UNREADABLE, f"lstat: {e.strerror}")
        if not stat.S_ISREG(st.st_mode):
            file = FileStat.of(st)
            return file, ContentVerdict(Content.NOT_A_FILE, _not_a_file(dir_fd, name, file))
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        return _looked_at(dir_fd, name), ContentVerdict(Content.UNREADABLE, f"open: {e.strerror}")
    file = UNKNOWN_FILE
    try:
        file = FileStat.of(os.fstat(fd))
        if file.kind != "file":
            return file, ContentVerdict(Content.NOT_A_FILE, "replaced by a non-file while read")
        if file.size > content.MAX_ENTRY_BYTES:
            return file, ContentVerdict(
                Content.OVERSIZED, f"{file.size} bytes, over {content.MAX_ENTRY_BYTES}"
            )
        # The size fstat gave and a byte more, to see whether it grows while read.
        data = os.read(fd, file.size + 1)
        if len(data) > file.size:
            data = _read_on(fd, data)
    except OSError as e:
        return file, ContentVerdict(Content.UNREADABLE, f"read: {e.strerror}")
    finally:
        os.close(fd)
    if len(data) > content.MAX_ENTRY_BYTES:
        return file, ContentVerdict(Content.OVERSIZED, f"grew past {content.MAX_ENTRY_BYTES} bytes")
    return file, judge(data)


def _looked_at(dir_fd: int, name: str) -> FileStat:
    """What lstat says of a file that could not be opened, for the report."""
    try:
        return FileStat.of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except OSError:
        return UNKNOWN_FILE


def _read_on(fd: int, start: bytes) -> bytes:
    """The rest of a file that grew while it was read, never past the limit."""
    chunks = [start]
    remaining = content.MAX_ENTRY_BYTES + 1 - len(start)
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def open_results_dir(path: str) -> int | None:
    """A descriptor for the results dir, None if there is none; never through a symlink, and
    never one that someone other than root (or whoever runs the reaper) can write to: files
    planted there would steer what it deletes through DEL."""
    try:
        fd = os.open(path, DIR_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ResultsDirError(
                e.errno, f"{path} is a symlink or not a directory; refusing to inspect it"
            ) from None
        raise ResultsDirError(e.errno, f"cannot open {path}: {e.strerror}") from None
    problem = untrusted(os.fstat(fd))
    if problem:
        os.close(fd)
        raise ResultsDirError(errno.EPERM, f"{path} {problem}; refusing to act on it")
    return fd


# The hidden names a move cut short left in a dir (leaving.py) -> the names put back
Settle = Callable[[list[str]], list[str]]


def inventory(
    dir_fd: int, networks: Collection[str], settle: Settle | None = None
) -> Iterator[CacheEntry]:
    """Every entry of the results dir in name order, classified; reads one file at a time.
    settle: as inspect_all's."""
    for name, file, found in inspect_all(dir_fd, settle=settle):
        yield _entry(name, file, found, networks)


def inspect_all(
    dir_fd: int,
    judge: Callable[[bytes], ContentVerdict | Identity] = content.judge,
    wanted: Callable[[str], bool] | None = None,
    settle: Settle | None = None,
) -> Iterator[tuple[str, FileStat, ContentVerdict | Identity]]:
    """_inspect() of every file of the dir (those whose names wanted takes), in name order:
    the name, its stat and what judge makes of it. One file read at a time. A regular file a
    move cut short hid (leaving.py) is no file of the dir's: it is handed to settle, first,
    and the names that puts back are judged with the rest."""
    # The listing's file type spares a regular file its lstat: it is opened without following
    # links and fstat-ed instead; anything else is lstat-ed and never opened.
    names = []
    irregular = set()
    with os.scandir(dir_fd) as listing:
        for dirent in listing:
            names.append(dirent.name)
            if not dirent.is_file(follow_symlinks=False):
                irregular.add(dirent.name)
    names.sort()
    # Only a name the scan would take can have been hidden by a move from this dir.
    hidden = [
        name
        for name in leaving.hidden_among(names)
        if name not in irregular and (wanted is None or wanted(str(leaving.original_of(name))))
    ]
    if hidden:
        names = sorted({*names, *(settle(hidden) if settle else ())} - set(hidden))
    if wanted is not None:
        names = [name for name in names if wanted(name)]
    for name in names:
        inspected = _inspect(dir_fd, name, name not in irregular, judge)
        if inspected is not None:
            yield (name, *inspected)


def whole_entries(dir_fd: int, network: str, networks: Collection[str]) -> Iterator[CacheEntry]:
    """The whole entries of one network, in name order, read again: for the config one of them
    cached, when no conf dir names the network any more."""
    for name in sorted(n for n in os.listdir(dir_fd) if n.startswith(f"{network}-")):
        inspected = _inspect(dir_fd, name, regular=True)  # opened without following links
        if inspected is not None:
            entry = _entry(name, *inspected, networks)
            if entry.content is Content.VALID and entry.split and entry.split.network == network:
                yield entry


def _entry(
    name: str, file: FileStat, found: ContentVerdict | Identity, networks: Collection[str]
) -> CacheEntry:
    if isinstance(found, Identity):
        if all(found) and found.file_name == name:
            # The common case: a whole entry whose fields name the file.
            return CacheEntry(name, file, _VALID, found, None)
        verdict = _mismatched(found)
    else:
        verdict = found
    split, problem = _split(name, verdict, networks)
    return CacheEntry(name, file, verdict, split, problem)


def _mismatched(identity: Identity) -> ContentVerdict:
    """A decoded entry whose fields disagree with its file name."""
    return ContentVerdict(
        Content.MISMATCHED,
        f"its fields say network {identity.network!r}, container {identity.container_id!r}, "
        f"ifname {identity.ifname!r}",
        identity,
    )


def _split(
    name: str, verdict: ContentVerdict, networks: Collection[str]
) -> tuple[Identity | None, str | None]:
    """How the file name reads, with the entry's own network name known too."""
    identity = verdict.identity
    if identity is not None and identity.network:
        networks = set(networks) | {identity.network}
    return split_name(name, networks)


def cached_netns(dir_fd: int, names: Iterable[str], container_id: str) -> set[str]:
    """The network namespaces the whole entries of a container name, among the results dir's
    names: libcni from 1.2 on caches each attachment's netns. Read only when some namespace is
    still mounted, so rarely."""
    found = set()
    for name in names:
        if f"-{container_id}-" not in name:
            continue
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            try:
                doc = content.decode(f.read(content.MAX_ENTRY_BYTES).decode("utf-8", "replace"))
            except (ValueError, RecursionError, OSError):
                continue
        netns = doc.get("netns") if isinstance(doc, dict) else None
        if isinstance(netns, str) and netns:
            found.add(netns)
    return found


class CachedAttachment(Record):
    """What a whole entry holds that a DEL needs: libcni's GCNetworkList runs DEL with these."""

    config: bytes | None  # the conflist (or single conf) ADD ran with, if the entry has it
    cni_args: tuple[tuple[str, str], ...]
    capability_args: dict[str, Any] | None
    result: dict[str, Any] | None  # the final ADD result; a legacy entry is one


def read_cached(dir_fd: int, entry: CacheEntry) -> CachedAttachment | str:
    """The DEL inputs of an entry the inventory found whole, read again through the dir; or
    why they cannot be used: the file changed since, or someone other than root could have
    written it (its config would decide which plugin runs as root)."""
    try:
        fd = os.open(entry.name, READ_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        return f"cannot open it again: {e.strerror}"
    try:
        st = os.fstat(fd)
        if not entry.file.same_file(st):
            return "changed since the scan"
        problem = untrusted(st)
        if problem:
            return f"the file {problem}"
        data = os.read(fd, content.MAX_ENTRY_BYTES + 1)
    except OSError as e:
        return f"cannot read it again: {e.strerror}"
    finally:
        os.close(fd)
    try:
        doc = content.decode(data.rstrip(b"\0 \t\r\n").decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return "no longer JSON"
    if not isinstance(doc, dict):
        return "no longer a JSON object"
    if entry.content is Content.LEGACY:
        return CachedAttachment(None, (), None, doc)
    config = doc.get("config")
    import base64  # noqa: PLC0415 (only a DEL's planning reads a cached config)

    try:
        bare = content.without_newlines(config) if config else None
        config_bytes = base64.b64decode(bare, validate=True) if bare else None
    except (ValueError, TypeError):
        return "its config is not base64"
    args = doc.get("cniArgs") or []
    capability_args = doc.get("capabilityArgs")
    result = doc.get("result")
    return CachedAttachment(
        config_bytes,
        tuple((str(k), str(v)) for k, v in args),
        capability_args if isinstance(capability_args, dict) else None,
        result if isinstance(result, dict) else None,
    )
