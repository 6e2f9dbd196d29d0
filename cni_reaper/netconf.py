"""CNI network configuration: the conf dirs as libcni and go-cni load them.

A `.conflist` is a list as written; a `.conf` or `.json` single plugin becomes a one-plugin list
carrying its name and cniVersion, as libcni's ConfListFromConf does.
"""

from __future__ import annotations

import codecs
import functools
import json
import math
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping

from cni_reaper.content import no_constants
from cni_reaper.record import Record
from cni_reaper.trust import resolve_trusted, untrusted
from cni_reaper.unopened import NotRegularFile, open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    Answer = TypeVar("Answer")

CONF_EXTENSIONS = (".conflist", ".conf", ".json")
MAX_CONF_BYTES = 1 << 20
MAX_PLUGINS = 64

# containerd's go-cni adds this network itself; it is in no conf dir.
BUILTIN_LOOPBACK = "cni-loopback"
BUILTIN_LOOPBACK_VERSION = "0.3.1"


class ConfigError(ValueError):
    """A config that libcni would refuse."""


class NetworkList(Record):
    name: str
    cni_version: str
    plugins: tuple[dict[str, Any], ...]
    source: str  # the file it came from

    @property
    def plugin_types(self) -> tuple[str, ...]:
        return tuple(str(go_field(p, "type") or "") for p in self.plugins)

    @property
    def reads_cached_result(self) -> bool:
        """libcni reads the results cache on DEL only from cniVersion 0.4.0 on
        (version.GreaterThanOrEqualTo(list.CNIVersion, "0.4.0")); with a cniVersion it cannot
        parse, its DEL fails before reading anything (see version_problem)."""
        parsed = _parsed_version(self.cni_version)
        return isinstance(parsed, tuple) and parsed >= CACHED_RESULT_SINCE

    @property
    def version_problem(self) -> str | None:
        """libcni's error for a cniVersion it cannot parse: DelNetworkList returns it before
        running any plugin, so no DEL of this network ever succeeds."""
        parsed = _parsed_version(self.cni_version)
        return parsed if isinstance(parsed, str) else None


class NetworkConfigs(Record):
    networks: dict[str, NetworkList]  # by name; the first file in load order wins
    problems: tuple[str, ...]  # files that were skipped, and why

    def get(self, name: str) -> NetworkList | None:
        return self.networks.get(name)


class PerChain:
    """One run's answers to one question about chains, each asked once per chain object (and
    key): most entries and orphans share a chain, and an answer walks its plugins' keys as Go
    decodes them, or resolves a path inside the root. The chain is kept beside its answer, so
    that its id() names no other chain while the answer is kept."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, str], tuple[NetworkList, Any]] = {}

    def get(
        self, netlist: NetworkList, answer: Callable[[NetworkList], Answer], key: str = ""
    ) -> Answer:
        """The answer for netlist (and key), answer(netlist) the first time it is asked."""
        found = self._known.get((id(netlist), key))
        if found is None or found[0] is not netlist:
            found = self._known[(id(netlist), key)] = (netlist, answer(netlist))
        given: Answer = found[1]
        return given

    def known(self, netlist: NetworkList, key: str = "") -> Any:
        """The answer for netlist (and key) if it was asked for, else None."""
        found = self._known.get((id(netlist), key))
        return found[1] if found is not None and found[0] is netlist else None


# DelNetworkList reads the cached result from this cniVersion on.
CACHED_RESULT_SINCE = (0, 4, 0)

_UINT64_MAX = (1 << 64) - 1
_INT_MIN = -(1 << 63)  # Go's int on the 64-bit platforms nodes run
_INT_MAX = (1 << 63) - 1


def parse_version(text: str) -> tuple[int, int, int]:
    """A cniVersion as libcni's version.ParseVersion reads it (cni pkg/version/plugin.go,
    v1.1.x; the same through v1.3.0): "" is 0.1.0; up to three parts split at "." (strings.Split,
    so "" parts are kept), missing ones 0 ("0.4" is 0.4.0); each part is strconv.Atoi's: an
    optional '+' or '-', then ASCII digits only, within Go's int. Python's int() is not that:
    it takes '_', whitespace and non-ASCII digits, and has no bound.

    libcni v0.8.x and v1.0.x (containerd 1.6.0-1.6.3, CRI-O 1.20-1.22 and any 1.23/1.24 release
    that vendors v1.0.1) differ in one case only: "" is an error there, `invalid version "": the
    version is empty`, so their DEL of a list with no cniVersion fails before any plugin.

    Raises ConfigError with libcni's message for what it rejects."""
    parsed = _parsed_version(text)
    if isinstance(parsed, str):
        raise ConfigError(parsed)
    return parsed


@functools.lru_cache(maxsize=64)  # asked per damaged file, of the few versions there are
def _parsed_version(text: str) -> tuple[int, int, int] | str:
    """The version, or libcni's error message."""
    if text == "":  # "special case: no version declared == v0.1.0"
        return (0, 1, 0)
    parts = text.split(".")
    if len(parts) >= 4:
        return f"invalid version {go_quote(text)}: too many parts"
    numbers = [0, 0, 0]
    for position, (part, which) in enumerate(zip(parts, ("major", "minor", "micro"))):
        try:
            numbers[position] = go_atoi(part)
        except ValueError as e:
            return f"failed to convert {which} version part {go_quote(part)}: {e}"
    return (numbers[0], numbers[1], numbers[2])


def go_atoi(text: str) -> int:
    """Go's strconv.Atoi on a 64-bit platform; ValueError carries Go's message."""
    digits = text.encode("utf-8", "surrogatepass")  # Go looks at the bytes
    negative = digits[:1] == b"-"
    if digits[:1] in (b"+", b"-"):
        digits = digits[1:]
    value = 0
    for byte in digits:
        if not 0x30 <= byte <= 0x39:
            raise ValueError(_atoi_error(text, "invalid syntax"))
        value = value * 10 + byte - 0x30
        # ParseUint gives up at the first digit that overflows uint64, before it looks at the
        # rest: "99999999999999999999x" is out of range, not a syntax error.
        if value > _UINT64_MAX:
            raise ValueError(_atoi_error(text, "value out of range"))
    if not digits:
        raise ValueError(_atoi_error(text, "invalid syntax"))
    if negative:
        value = -value
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(_atoi_error(text, "value out of range"))
    return value


def _atoi_error(text: str, why: str) -> str:
    return f"strconv.Atoi: parsing {go_quote(text)}: {why}"


_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def go_quote(text: str) -> str:
    """A string as Go's %q (strconv.Quote) writes it, for libcni's messages."""
    out = ['"']
    for char in text:
        code = ord(char)
        if 0xD800 <= code <= 0xDFFF:
            # Go's JSON decoder turns a lone surrogate escape into U+FFFD; Python's keeps it.
            out.append("\ufffd")
        elif char in ('"', "\\"):
            out.append("\\" + char)
        elif char.isprintable():
            # Python's printable classes are Go's unicode.IsPrint: letters, marks, numbers,
            # punctuation, symbols and the ASCII space.
            out.append(char)
        elif char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def go_pairs(obj: Mapping[str, Any] | tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """An object's members in the order a plugin decodes them: libcni hands each plugin its
    config re-marshalled from a map (ConfListFromBytes, InjectConf), and Go marshals a map's
    keys sorted, at every level. Members already in order are taken as they are."""
    return obj if isinstance(obj, tuple) else tuple(sorted(obj.items()))


def _folded(key: str) -> str:
    # Go's encoding/json matches a key to a field in any case; it folds the long s and the
    # Kelvin sign onto s and k, which lower() does for the Kelvin sign only.
    return key.replace("\u017f", "s").lower()


def _given(
    obj: Mapping[str, Any] | tuple[tuple[str, Any], ...], name: str
) -> list[tuple[str, Any]]:
    """The members given for the field tagged name, every key equal to it in any case, in the
    order a plugin decodes them (go_pairs): only those are put in order."""
    folded = name.lower()
    if isinstance(obj, tuple):
        return [(key, item) for key, item in obj if _folded(key) == folded]
    return sorted(
        ((key, item) for key, item in obj.items() if _folded(key) == folded),
        key=lambda member: member[0],
    )


def go_field(
    obj: Mapping[str, Any] | tuple[tuple[str, Any], ...], name: str, *, null_resets: bool = False
) -> Any:
    """What Go's encoding/json decodes into the string (or number) field tagged name: the
    members given for it (_given), the last winning; a null leaves the field as it was (None
    here: absent), or, null_resets, empties it (a slice's, a pointer's)."""
    value = None
    for _key, item in _given(obj, name):
        if item is not None or null_resets:
            value = item
    return value


def go_string(obj: Mapping[str, Any] | tuple[tuple[str, Any], ...], name: str) -> str:
    """What Go decodes into the string field tagged name ("" where none is given, go_field's
    last); ValueError where any member given for it is neither a string nor null, for which
    Go fails the decoding of the whole document."""
    value = ""
    for _key, item in _given(obj, name):
        if item is not None:
            if type(item) is not str:
                raise ValueError(f"its {name} is no string")
            value = item
    return value


def go_object(
    obj: Mapping[str, Any] | tuple[tuple[str, Any], ...], name: str, *, null_resets: bool = False
) -> Any:
    """What Go decodes into the struct (or, null_resets, map) field tagged name: the members
    of every object given for it (_given), merged in decoding order (a later one's fields
    decoded after an earlier one's), as a tuple of pairs for go_field; a null leaves a struct
    as it was and empties a map. None when there is none; the value itself when it is no
    object (Go then fails the whole decoding)."""
    merged: tuple[tuple[str, Any], ...] | None = None
    for _key, item in _given(obj, name):
        if item is None:
            merged = None if null_resets else merged
        elif not isinstance(item, dict):
            return item
        else:
            merged = (*(merged or ()), *go_pairs(item))
    return merged


def configs_running(netlist: NetworkList, kind: str) -> Iterator[Mapping[str, Any]]:
    """Each plugin config of the chain a DEL hands to a plugin of this type: the config of a
    plugin of the type, and of a plugin whose "ipam" names it, since an IPAM plugin is handed
    the config of the plugin that execs it, whose top-level keys it reads."""
    for conf in netlist.plugins:
        ipam = go_object(conf, "ipam")
        if go_field(conf, "type") == kind or (
            isinstance(ipam, tuple) and go_field(ipam, "type") == kind
        ):
            yield conf


def kinds_run(netlist: NetworkList) -> set[Any]:
    """Every plugin type a DEL through the chain runs, as plugin.resolve_chain finds them:
    each plugin's "type", and the "type" of each one's "ipam" object, whose plugin it execs."""
    kinds = set()
    for conf in netlist.plugins:
        kinds.add(go_field(conf, "type"))
        ipam = go_object(conf, "ipam")
        if isinstance(ipam, tuple):
            kinds.add(go_field(ipam, "type"))
    return kinds


def as_go_decodes(value: Any) -> Any:
    """A decoded document as libcni holds it after its own decoding into map[string]any: a
    lone surrogate escape is U+FFFD (Python keeps it, and no file name can hold it), two keys
    made one by that keep the later value, and a number past float64's range fails the
    decoding (Python makes it an int, or inf). Changed in place, walked without recursion: the
    document may nest as deep as the decoder allowed."""
    top = [value]
    pending: list[tuple[Any, Any]] = [(top, 0)]  # (container, slot) of a value to look at
    while pending:
        into, slot = pending.pop()
        item = into[slot]
        if isinstance(item, dict):
            if not all(map(_well_formed, item)):
                item = into[slot] = {_as_go_string(k): v for k, v in item.items()}
            pending.extend((item, key) for key in item)
        elif isinstance(item, list):
            pending.extend((item, index) for index in range(len(item)))
        elif isinstance(item, str):
            if not _well_formed(item):
                into[slot] = _as_go_string(item)
        elif type(item) in (int, float) and not math.isfinite(float64_of(item)):
            raise ConfigError("a number out of float64's range, which Go cannot decode")
    return top[0]


def float64_of(number: float) -> float:
    """The float64 Go's decoder makes of a JSON number: the nearest, as float() rounds, so
    that one up to half a unit past the largest is the largest; past that, inf (Go's range
    error; an int raises OverflowError in float())."""
    try:
        return float(number)
    except OverflowError:
        return math.inf


def _well_formed(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _as_go_string(text: str) -> str:
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def _netconf_problem(members: tuple[tuple[str, Any], ...]) -> None:
    """ConfigError where Go could not decode a plugin's config into libcni's types.NetConf
    (ConfFromBytes), which fails the whole config: a member of one of its fields, in any
    spelling, of another type than the field's (a null is of every type)."""
    for key, value in members:
        field = _folded(key)
        if value is None or field not in _NETCONF_FIELDS:
            continue
        if not _NETCONF_FIELDS[field](value):
            raise ConfigError(f"a plugin's {key!r} is not what libcni decodes it into")


def _as_map(value: Any) -> Any:
    """Members in order, as a single conf's are read, as the map Go decodes them into."""
    return dict(value) if isinstance(value, tuple) else value


def _is_ipam(value: Any) -> bool:
    value = _as_map(value)
    return isinstance(value, dict) and all(
        v is None or isinstance(v, str) for k, v in value.items() if _folded(k) == "type"
    )


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(v is None or isinstance(v, str) for v in value)


def _is_dns(value: Any) -> bool:
    value = _as_map(value)
    checks: dict[str, Callable[[Any], bool]] = {
        "nameservers": _is_str_list,
        "search": _is_str_list,
        "options": _is_str_list,
        "domain": lambda v: isinstance(v, str),
    }
    return isinstance(value, dict) and all(
        v is None or checks.get(_folded(k), lambda _: True)(v) for k, v in value.items()
    )


def _is_bool_map(value: Any) -> bool:
    value = _as_map(value)
    return isinstance(value, dict) and all(v is None or type(v) is bool for v in value.values())


# types.NetConf's fields, by folded key: what Go decodes each from.
_NETCONF_FIELDS: dict[str, Callable[[Any], bool]] = {
    "cniversion": lambda v: isinstance(v, str),
    "name": lambda v: isinstance(v, str),
    "type": lambda v: isinstance(v, str),
    "capabilities": _is_bool_map,
    "ipam": _is_ipam,
    "dns": _is_dns,
    "prevresult": lambda v: isinstance(v, (dict, tuple)),
}


def _go_number(text: str) -> int | float:
    # A float64 keeps the sign of -0, which reaches a plugin as libcni writes it back.
    return -0.0 if text == "-0" else int(text)


_AS_GO_READS: dict[str, Any] = {"parse_constant": no_constants, "parse_int": _go_number}


def _one_byte_each(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)  # registered for decoding only
    return "\ufffd", error.start + 1


# Go reads each byte of an invalid UTF-8 sequence as U+FFFD, where Python's "replace" reads
# a truncated sequence as one: the names differ, and a network's name is its files' names.
codecs.register_error("cni_reaper.go_utf8", _one_byte_each)


def _not_json(data: bytes, error: Exception) -> ConfigError:
    """Why the bytes are no config libcni reads, in the operator's terms: an encoding that is
    not plain UTF-8 is the likely mistake of an editor, and Python's own advice would mislead."""
    if data.startswith(codecs.BOM_UTF8):
        return ConfigError("not JSON libcni reads: it starts with a byte order mark")
    if data and not data.strip(b"\0"):
        return ConfigError(f"only NUL bytes ({len(data)}), as a crash may leave a file")
    if b"\0" in data[:4] or data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return ConfigError("not JSON libcni reads: UTF-16 or UTF-32, not UTF-8")
    return ConfigError(f"not JSON: {error}")


def as_go_reads(data: bytes) -> str:
    """A JSON document's bytes as Go's decoder reads them, to be decoded from the text: as
    UTF-8, invalid bytes one U+FFFD each (an error where no string holds them, as in Go), and
    no byte order mark or UTF-16 or UTF-32, which json.loads would take from bytes and Go
    refuses (a config libcni cannot load is not the network a runtime ran)."""
    return data.decode("utf-8", "cni_reaper.go_utf8")


def parse_conf_bytes(data: bytes, source: str, single_plugin: bool | None) -> NetworkList:
    """A conf file's network list; single_plugin None: a config an entry cached, the conflist
    ADD ran with (AddNetworkList) or, with no 'plugins', a single plugin's conf (AddNetwork)."""
    try:
        text = as_go_reads(data)
        doc = as_go_decodes(json.loads(text, **_AS_GO_READS))
        if single_plugin is None:
            single_plugin = isinstance(doc, dict) and "plugins" not in doc
        # ConfFromBytes decodes a single conf's own bytes: its members in the file's order,
        # a key given twice included.
        in_order = (
            json.loads(text, object_pairs_hook=tuple, **_AS_GO_READS) if single_plugin else None
        )
    except (ValueError, RecursionError) as e:
        raise _not_json(data, e) from None
    if not isinstance(doc, dict):
        raise ConfigError("not a JSON object")
    # A conflist's own keys are looked up in a map (ConfListFromBytes), a single conf is
    # decoded into types.NetConf (ConfFromBytes), whose fields match any case.
    if in_order is not None:
        _netconf_problem(in_order)
        name, version = go_field(in_order, "name"), go_field(in_order, "cniVersion")
        name = _as_go_string(name) if isinstance(name, str) else name
        version = "" if version is None else _as_go_string(version)
        if not go_field(in_order, "type"):
            raise ConfigError("a plugin has no 'type'")
    else:
        name, version = doc.get("name"), doc.get("cniVersion", "")
    if not isinstance(name, str) or not name:
        raise ConfigError("no network 'name'")
    if not isinstance(version, str):
        raise ConfigError("'cniVersion' is not a string")
    if single_plugin:
        plugins: Any = [doc]
    else:
        plugins = doc.get("plugins")
        if not isinstance(plugins, list) or not plugins:
            raise ConfigError("no 'plugins' list")
        if len(plugins) > MAX_PLUGINS:
            # Real chains have a handful; a DEL through thousands, each with its own timeout,
            # would hold the runtime back for hours.
            raise ConfigError(f"{len(plugins)} plugins, more than {MAX_PLUGINS}")
    for plugin in plugins:
        if not isinstance(plugin, dict):
            raise ConfigError("a plugin entry is not an object")
        _netconf_problem(go_pairs(plugin))
        kind = go_field(plugin, "type")
        if not isinstance(kind, str) or not kind:
            raise ConfigError("a plugin has no 'type'")
    return NetworkList(name=name, cni_version=version, plugins=tuple(plugins), source=source)


def _read_trusted(path: str) -> bytes:
    """A conf file's bytes, if it is a regular file only root (or the reaper's user) could have
    written: configs decide which plugin runs as root, and with what on its stdin. path has
    been walked (trust.resolve_trusted): no symlink is left in it."""
    try:
        fd = open_regular(path)
    except NotRegularFile as e:
        raise ConfigError(f"not a regular file (a {e.kind}, never opened)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())  # the file read, whatever the name pointed to before
        problem = untrusted(st)
        if problem:
            raise ConfigError(f"{path} {problem}; not read")
        if st.st_size > MAX_CONF_BYTES:
            raise ConfigError(f"larger than {MAX_CONF_BYTES} bytes")
        return f.read(MAX_CONF_BYTES + 1)


def _conf_file_bytes(path: str) -> bytes:
    """What libcni's os.ReadFile of a listed conf file reads, when it may be trusted."""
    found = resolve_trusted(path)
    if found.problem:
        raise ConfigError(found.problem)
    if found.st is None:
        raise ConfigError(f"{found.resolved} does not exist")  # a dangling symlink
    if stat.S_ISDIR(found.st.st_mode):
        # ConfFiles skips a dir by its lstat, so a symlink to one is listed, and reading it
        # fails: libcni's "read <path>: is a directory".
        raise ConfigError(f"a symlink to a directory, {found.resolved}")
    return _read_trusted(found.resolved)


def load_conf_dirs(conf_dirs: Iterable[str]) -> NetworkConfigs:
    """Every network in the conf dirs, files in name order per dir, dirs in the order given.

    The files are those libcni's ConfFiles lists (cni libcni/conf.go, v0.8.1 through v1.1.2):
    the dir's entries (ioutil.ReadDir, which lstats them) that are not directories, whose
    filepath.Ext is one of the extensions (a name ending in one of them, since each has a single
    dot). A symlink is therefore listed, even to a directory, and libcni's os.ReadFile follows
    it; so does this, with the target's path walked as trust.resolve_trusted walks it. A conf
    dir whose path is not trusted, or a file (or target) that is not, is skipped as a problem.
    """
    networks: dict[str, NetworkList] = {}
    problems: list[str] = []
    for conf_dir in conf_dirs:
        found = resolve_trusted(conf_dir)
        if found.problem:
            problems.append(f"{conf_dir}: {found.problem}; its configs not read")
            continue
        if found.st is None:
            continue  # ConfFiles: no dir, no files
        try:
            # Go sorts file names by their bytes.
            names = sorted(os.listdir(found.resolved), key=os.fsencode)
        except OSError as e:
            problems.append(f"{conf_dir}: {e.strerror or e}")
            continue
        for file_name in names:
            if not file_name.endswith(CONF_EXTENSIONS):
                continue
            path = os.path.join(conf_dir, file_name)
            try:
                if stat.S_ISDIR(os.lstat(os.path.join(found.resolved, file_name)).st_mode):
                    continue  # ConfFiles skips directories
                data = _conf_file_bytes(os.path.join(found.resolved, file_name))
                netlist = parse_conf_bytes(
                    data, path, single_plugin=not file_name.endswith(".conflist")
                )
            except (ConfigError, OSError) as e:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                problems.append(f"{path}: {reason}")
                continue
            networks.setdefault(netlist.name, netlist)
    return NetworkConfigs(networks=networks, problems=tuple(problems))


def builtin_loopback() -> NetworkList:
    return NetworkList(
        name=BUILTIN_LOOPBACK,
        cni_version=BUILTIN_LOOPBACK_VERSION,
        plugins=({"type": "loopback"},),
        source="containerd built-in",
    )
