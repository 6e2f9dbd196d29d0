"""flannel's scratch file: the delegate config its DEL runs, not the config it is given.

flannel's ADD writes the delegate config it builds (a bridge, its ipam host-local's with
flannel's own ipam section) to `<dataDir>/<container ID>`, dataDir being flannel's own key,
/var/lib/cni/flannel by default; its DEL reads that file and runs the delegate on it, then
removes it. A missing file, or one that does not decode, ends the DEL with success and no
delegate run (flannel-io/cni-plugin: saveScratchNetConf, consumeScratchNetConf, doCmdDel;
shared/reference/node-state.md section 4). So the host-local store a DEL through flannel
releases from is the one the file names, which is the one the config names only while the
config is as it was at ADD.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection

from cni_reaper import host_local, multus
from cni_reaper.netconf import (
    NetworkConfigs,
    NetworkList,
    as_go_reads,
    configs_running,
    go_field,
    kinds_run,
    parse_conf_bytes,
)
from cni_reaper.node_root import LeavesRoot, RootBinds, host_path, resolve_inside
from cni_reaper.unopened import READ_FLAGS, NotRegularFile, refuse_unless_regular

DEFAULT_DATA_DIR = "/var/lib/cni/flannel"
# A delegate config is some 300 bytes; past this, what flannel would make of it is not read.
MAX_SCRATCH_BYTES = 1 << 16


def runs(netlist: NetworkList) -> bool:
    """Whether a DEL through the chain runs flannel, as a plugin or as one's IPAM plugin:
    only then is scratch_problem() asked."""
    return "flannel" in kinds_run(netlist)


def scratch_problem(
    netlist: NetworkList,
    container_id: str,
    binds: RootBinds,
    read_stores: Collection[str],
) -> str | None:
    """Why a DEL of the container through this chain may not run, if it runs flannel: the
    delegate config flannel kept keeps its host-local store elsewhere than read_stores (the
    stores this run read and checks the DEL against), cannot be told, or, under a root other
    than /, lies where the plugins would see this machine's own files."""
    for plugin in configs_running(netlist, "flannel"):
        # flannel sets the default, then decodes its config over it: a null keeps it, an
        # empty string does not.
        data_dir = go_field(plugin, "dataDir")
        data_dir = data_dir if isinstance(data_dir, str) else DEFAULT_DATA_DIR
        # Go's filepath.Join; a relative dataDir is the plugin's working dir's, which is /.
        node_path = os.path.normpath("/" + os.path.join(data_dir, container_id).lstrip("/"))
        if not _seen_as_the_root_has_it(node_path, binds):
            return (
                f"flannel's dataDir {data_dir!r} is not one the plugins see under {binds.root}, or "
                "is reached through a symlink: its DEL would read this machine's own"
            )
        why = _delegate_problem(node_path, container_id, binds, read_stores)
        if why is not None:
            return why
    return None


def _seen_as_the_root_has_it(node_path: str, binds: RootBinds) -> bool:
    """Whether a plugin run under the root sees the root's own node_path: the root is /, or
    node_path lies in a dir bound there (confine.py) and no symlink is on its way, which the
    plugin would follow as this machine has it."""
    if not binds.confined:
        return True
    if not binds.covers(os.path.dirname(node_path)):
        return False
    root = binds.root
    try:
        return resolve_inside(root, node_path) == host_path(root, node_path)
    except (LeavesRoot, OSError):
        return False


def _delegate_problem(
    node_path: str,
    container_id: str,
    binds: RootBinds,
    read_stores: Collection[str],
) -> str | None:
    root = binds.root
    # Under a root, scratch_problem() has seen no symlink on the way: the path as named is
    # the one the plugin opens.
    path = host_path(root, node_path)
    kept = f"flannel's DEL runs the delegate config it kept in {path}"
    try:
        refuse_unless_regular(path)
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return None  # no scratch file: flannel's DEL runs no delegate
    except (NotRegularFile, OSError):
        return f"{kept}, which is no file to read"
    try:
        data = os.read(fd, MAX_SCRATCH_BYTES + 1)
    except OSError as e:
        return f"{kept}, which cannot be read: {e}"
    finally:
        os.close(fd)
    if not data.strip(b"\0"):
        return None  # empty or zeroed, as a crash leaves it: no delegate runs
    if len(data) > MAX_SCRATCH_BYTES:
        return f"{kept}, which holds more than {MAX_SCRATCH_BYTES} bytes"
    try:
        # flannel hands the file's bytes to its delegate as they are, which Go decodes in file
        # order, a key in any case: one given twice leaves which one wins to that order.
        json.loads(as_go_reads(data), object_pairs_hook=_once_each)
        delegate = parse_conf_bytes(data, node_path, True)
    except RecursionError:
        return f"{kept}, which nests too deep to decode here: what it would release cannot be told"
    except ValueError as e:
        return f"{kept}, which does not decode here ({e}): what it would release cannot be told"
    if not kinds_run(delegate).isdisjoint(multus.DELEGATING):
        return f"{kept}, whose delegate delegates again: what that would release is not read"
    twice = host_local.twice(delegate)
    if twice is not None:
        return twice
    if not host_local.data_dirs(NetworkConfigs({delegate.name: delegate}, ())):
        return None  # its delegate runs no host-local
    named = host_local.store_of(delegate, "/")  # as the plugin names it
    if named is not None and not _seen_as_the_root_has_it(named, binds):
        return (
            f"{kept}, whose host-local keeps {named}: not a store the plugins see under {root}, "
            "or one reached through a symlink"
        )
    store = host_local.store_of(delegate, root)
    if store is None or store not in read_stores:
        where = store if store is not None else "a store that cannot be reached"
        return (
            f"{kept}, whose host-local keeps {where}, not the store this run read for the network"
        )
    return None


def _once_each(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """An object's members, refused if a key is given twice, in any case."""
    folded = {key.casefold() for key, _ in pairs}  # takes Go's folds (the Kelvin sign, the long s)
    if len(folded) != len(pairs):
        raise ValueError("a key given twice, in some case")
    return dict(pairs)
