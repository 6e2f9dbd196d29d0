"""What a runtime's systemd unit passes on its command line: the flags that move where the
runtime keeps its records, followed where the unit is plain, and otherwise a reason to doubt
those records (inventory.py then calls no sandbox forgotten). Reading a flag the runtime does
not use would be worse than reading none: records read in the wrong place can make a sandbox
the runtime still knows look forgotten. So whatever is not plain is doubt.

Facts (systemd's conf-parser.c and fileio.c, systemd.unit(5), systemd.service(5),
systemd.exec(5); an attack review checked them on 2026-12-05):
- A unit is read from the first dir of the search path that has it; a symlink to /dev/null
  or an empty file masks it. Its drop-ins `*.conf` (not hidden) come from `<unit>.d`, from the
  dash-prefix dirs (`k3s-.service.d` for `k3s-agent.service`) and from `service.d`, in every
  dir, ordered by file name, a name in an earlier dir hiding it in a later one.
- A line ends at LF, CR or NUL. A line whose first non-blank is `#` or `;` is a comment, also
  inside a continuation; a line ending in an unescaped backslash goes on in the next. A byte
  order mark is dropped; keys and values are stripped of blanks, tabs, CR and LF only.
- An empty `ExecStart=` drops those before it; more than one is only for Type=oneshot. The
  first word may carry the prefixes `-`, `@`, `:`, `+`, `!`, `|`; with `@` the second word is
  argv[0]. Words are split at blanks and may be quoted; C escapes, `$VAR` and `%` specifiers
  are expanded.
- containerd (urfave/cli, Go's flag package): `--root`, `--config`/`-c`, `--state`,
  `--address`/`-a`; one dash or two, `--flag value` or `--flag=value`; flags end at the first
  argument that is not one, or at `--`; an empty value is skipped; both forms of one flag and
  it does not start. k3s and RKE2: `server` or `agent`, then `--data-dir`/`-d`, with their
  config file from `K3S_CONFIG_FILE`/`RKE2_CONFIG_FILE` (`--config`/`-c`) and the data dir
  also from `K3S_DATA_DIR`/`RKE2_DATA_DIR`. The k3s installer writes each of its arguments
  on a line of its own in single quotes (INSTALL_K3S_EXEC), and every K3S_ variable of its
  environment into `/etc/systemd/system/<unit>.env`. k3s's urfave/cli v1 first moves every
  word that is no flag of its own to the end (a flag's value beginning with "-" too). Its
  newest releases use urfave/cli v3 (command_parse.go): a flag that is no bool takes the next
  word whatever it is, a bool none, an unknown flag fails the start, and words that are no
  flags do not end the flags; so what is followed here is read alike by all three.
- CRI-O (urfave/cli v2, internal/criocli/criocli.go): `--root`/`-r`, `--runroot`, `--listen`,
  each also from a CONTAINER_* variable. Its packaged crio.service (contrib/systemd, Fedora's)
  runs `crio $CRIO_CONFIG_OPTIONS ... $CRIO_METRICS_OPTIONS` with
  EnvironmentFile=-/etc/sysconfig/crio, where contrib/sysconfig/crio sets none of them.
- systemd.service(5), systemd.exec(5): a word `$NAME` is replaced by the variable's value split
  at blanks, no word where it is empty or not set; Environment= is read first, then the
  environment files in order, a later setting winning; an empty Environment= or
  EnvironmentFile= drops those before it. An environment file's line that ends in a backslash
  goes on in the next, a comment's too; values may be quoted in parts.
"""

from __future__ import annotations

import functools
import posixpath
import re

from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import AnyStr, Protocol

    class Files(Protocol):
        """How units are read: config.py's reader of the node's files, inside its root."""

        root: str
        warnings: list[str]

        def path(self, node_path: str) -> str: ...

        def text(self, node_path: str, language: str) -> str | None: ...

        def data(self, node_path: str) -> bytes | None: ...

        def listing(self, node_dir: str) -> list[tuple[str, bool]]: ...

        def links(self, node_dir: str) -> dict[str, str] | None: ...

        def lstat_in(self, node_dir: str, names: Iterable[str]) -> dict[str, str] | None: ...


# The system unit search path, in systemd's order.
UNIT_DIRS = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/run/systemd/generator.late",
    "/lib/systemd/system",
)
# systemd's own config (systemd-system.conf(5)): since v256 the first of these, before it
# /etc's alone; all are read, which can only add doubt. Then its drop-in dirs.
# A split-usr build of systemd reads /lib's too.
SYSTEM_CONFS = (
    "/etc/systemd/system.conf",
    "/run/systemd/system.conf",
    "/usr/local/lib/systemd/system.conf",
    "/usr/lib/systemd/system.conf",
    "/lib/systemd/system.conf",
)
SYSTEM_CONF_DIRS = tuple(f"{conf}.d" for conf in SYSTEM_CONFS)
# Programs whose output systemd adds to every service's environment at its start
# (systemd.environment-generator(7)).
ENVIRONMENT_GENERATOR_DIRS = (
    "/run/systemd/system-environment-generators",
    "/etc/systemd/system-environment-generators",
    "/usr/local/lib/systemd/system-environment-generators",
    "/usr/lib/systemd/system-environment-generators",
    "/lib/systemd/system-environment-generators",
)
_NOT_PLAIN_TEXT = "\0\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # line ends systemd and Python disagree on
_NOT_PLAIN_COMMAND = "\\$%"  # escapes, variables, specifiers
_EXEC_PREFIXES = "-@:+!|"
# The runtime sees its own mount namespace's paths: a root bound from elsewhere is not the
# node's path of that name (systemd.exec(5)).
_REMAPS = (
    "BindPaths",
    "BindReadOnlyPaths",
    "RootDirectory",
    "RootImage",
    "MountImages",
    "ExtensionImages",
    "ExtensionDirectories",
    "TemporaryFileSystem",
)
# urfave/cli prints and exits on these: the runtime does not start.
_EXITING_FLAGS = ("help", "h", "version", "v")
MAX_UNIT_BYTES = 1 << 20  # a run's units, drop-ins and the files they name, together


class RuntimeUnits(Record):
    """How one runtime is started by systemd, and what of its command line the reaper reads."""

    units: tuple[str, ...]
    binary: str  # the executable's file name
    subcommands: tuple[str, ...]  # one of them comes first (k3s: server, agent); () none
    followed: tuple[str, ...]  # flag names whose values are taken
    forms: tuple[tuple[str, str], ...]  # the long and short names of one flag
    doubted: tuple[str, ...]  # flag names that put the records in doubt
    variables: tuple[str, ...]  # environment variables that do so
    # Units an installer named after the runtime (k3s-<name>.service): read, and ignored where
    # they run something else (k3s crictl, another binary).
    installed: tuple[str, ...] = ()
    unlisted: tuple[str, ...] = ()  # installers' dirs that could not be listed for them
    # Variables its packaged unit's command line expands, each a word of its own ($NAME), from
    # Environment= and its environment files (CRI-O's $CRIO_*_OPTIONS). Any other "$": doubt.
    expanded: tuple[str, ...] = ()
    # Flags of the runtime's own known to take no value (bools), or the next word as theirs:
    # skipped where they come before a followed one, which any other flag without "=" doubts.
    bools: tuple[str, ...] = ()
    valued: tuple[str, ...] = ()

    @property
    def every_variable(self) -> tuple[str, ...]:
        """The variables that move its records, and those its command line expands."""
        return (*self.variables, *self.expanded)


class UnitFlags(Record):
    """What a runtime's units say: each followed flag's value with where it was set, in
    command-line order, and why its records are in doubt (empty: they are not)."""

    values: tuple[tuple[str, str, str], ...]  # (flag name, value, where)
    doubts: tuple[str, ...]
    started: tuple[str, ...] = ()  # the units of the runtime systemd would start


class UnitFiles(Record):
    """Where systemd reads a unit from, and what of it the reaper could not read."""

    paths: tuple[str, ...] = ()  # the unit file, then its drop-ins in systemd's order
    unread: tuple[str, ...] = ()  # why some of it may be missed: each a doubt


class _NotPlain(Exception):
    """A unit, or a line of it, that could be read otherwise than the reaper reads it."""


class _NotTheRuntime(_NotPlain):
    """A command line that does not start the runtime at all."""


class UnitLines(Record):
    """The settings of a unit file or drop-in that matter here."""

    exec_start: tuple[str, ...]  # as written; "" for an ExecStart= that drops those before
    environment: tuple[str, ...]  # Environment= values; "" drops those before
    environment_files: tuple[str, ...]  # EnvironmentFile= values as written; "" as above
    remaps: tuple[str, ...]  # settings that show the runtime other paths than the node's
    # UnsetEnvironment= and PassEnvironment=, as "Key=value": they change what is expanded.
    environment_changes: tuple[str, ...] = ()


def read_unit(text: str) -> UnitLines:
    """The [Service] settings of one unit file or drop-in. Raises _NotPlain."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if any(char in text for char in _NOT_PLAIN_TEXT):
        raise _NotPlain("a NUL or a line break Python and systemd read differently")
    exec_start: list[str] = []
    environment: list[str] = []
    environment_files: list[str] = []
    remaps: list[str] = []
    environment_changes: list[str] = []
    section = ""
    parts: list[str] = []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for line in [*lines, ""]:  # the "": a continuation at the end of the file ends there
        stripped = line.strip(" \t")
        if stripped.startswith(("#", ";")):
            continue  # a comment, inside a continuation too
        if parts and not stripped:
            pass  # an empty line ends a continuation
        elif (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            parts.append(line[:-1] + " ")
            continue
        whole = ("".join(parts) + line).strip(" \t\n\r")
        parts.clear()
        if not whole:
            continue
        if whole.startswith("["):
            if not whole.endswith("]"):
                raise _NotPlain(f"{whole!r}: systemd reads no further")
            section = whole
            continue
        if whole.startswith(".include"):
            raise _NotPlain(".include: another file read in its place")
        if section != "[Service]" or "=" not in whole:
            continue
        key, value = (part.strip(" \t\n\r") for part in whole.split("=", 1))
        if key == "ExecStart":
            exec_start.append(value)
        elif key == "Environment":
            environment.append(value)
        elif key == "EnvironmentFile":
            environment_files.append(value)
        elif key in _REMAPS and value:
            remaps.append(f"{key}={value}")
        elif key in ("UnsetEnvironment", "PassEnvironment") and value:
            environment_changes.append(f"{key}={value}")
    return UnitLines(
        tuple(exec_start),
        tuple(environment),
        tuple(environment_files),
        tuple(remaps),
        tuple(environment_changes),
    )


def flag_name(word: str) -> str | None:
    """The flag a command-line word names (one dash or two, up to an "="), or None."""
    if not word.startswith("-") or word.startswith("---") or word in ("-", "--"):
        return None
    return word.lstrip("-").split("=", 1)[0]


def command_words(command: str, expand: Mapping[str, str] | None = None) -> list[str]:
    """The words of a plain ExecStart= command line: bare, or quoted whole. With expand, a
    bare word `$NAME` of one of its names is replaced by that value split at blanks, no word
    for an empty one, as systemd does. Raises _NotPlain for an escape, a specifier, any other
    variable, or a quote inside a word."""
    unplain = _NOT_PLAIN_COMMAND if expand is None else _NOT_PLAIN_COMMAND.replace("$", "")
    if any(char in command for char in unplain):
        raise _NotPlain("an escape, a variable or a specifier")
    words: list[str] = []
    at = 0
    while at < len(command):
        if command[at] in " \t":
            at += 1
            continue
        quote = command[at] if command[at] in "'\"" else ""
        if quote:
            end = command.find(quote, at + 1)
            if end < 0 or (end + 1 < len(command) and command[end + 1] not in " \t"):
                raise _NotPlain("a quote inside a word")
            word, at = command[at + 1 : end], end + 1
        else:
            end = at
            while end < len(command) and command[end] not in " \t":
                end += 1
            word, at = command[at:end], end
            if expand is not None and word[1:] in expand and word.startswith("$"):
                if not words:
                    raise _NotPlain(f"{word} as the command: systemd does not run it")
                words.extend(_value_words(word, expand[word[1:]]))
                continue
        if "'" in word or '"' in word:
            raise _NotPlain("a quote inside a word")
        if "$" in word:
            raise _NotPlain(f"{word!r}: a variable not followed")
        words.append(word)
    return words


def _value_words(word: str, value: str) -> list[str]:
    """A variable's value as the words systemd makes of it: split at blanks (and unquoted,
    unescaped, which a plain value needs not be)."""
    if any(char in value for char in "'\"\\"):
        raise _NotPlain(f"{word} has a quote or a backslash in its value")
    return [part for part in re.split("[ \t]+", value) if part]


def command_flags(
    command: str, runtime: RuntimeUnits, expand: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """The followed flags an ExecStart= command line gives the runtime, as its flag parser
    takes them, in order, expand being the values of its expanded variables. Raises _NotPlain
    where the reaper cannot be sure of that."""
    words = command_words(command, expand)
    if not words:
        raise _NotPlain("no command")
    first = words[0]
    prefix = first[: len(first) - len(first.lstrip(_EXEC_PREFIXES))]
    if "@" in prefix:
        raise _NotPlain("the @ prefix: argv[0] is another word")
    if len(set(prefix)) < len(prefix.replace("!!", "!")):
        raise _NotPlain(f"the prefix {prefix!r}: systemd takes each once")
    if ":" in prefix and expand is not None and "$" in command:
        raise _NotPlain("the : prefix: the runtime gets the variables' names, and fails")
    if posixpath.basename(first[len(prefix) :]) != runtime.binary:
        raise _NotTheRuntime(f"{first[len(prefix) :]!r} is not {runtime.binary} itself")
    args = words[1:]
    if runtime.subcommands:
        if not args or args[0] not in runtime.subcommands:
            if args and flag_name(args[0]) is None:
                raise _NotTheRuntime(f"{args[0]!r}, not {' or '.join(runtime.subcommands)}")
            raise _NotPlain(f"not {' or '.join(runtime.subcommands)} first")
        args = args[1:]
    if any(flag_name(word) in _EXITING_FLAGS for word in args):
        raise _NotPlain("a help or version flag: it prints and exits")
    ours = {*runtime.followed, *runtime.doubted}
    found: list[tuple[str, str]] = []
    at = 0
    while at < len(args):
        word = args[at]
        name = flag_name(word)
        if name is None:
            if word == "--" and at + 1 == len(args):
                break
            # Go's flag parsing ends here: what comes after is not the runtime's flags.
            raise _NotPlain(f"{word!r} ends the flags before the rest")
        if name in runtime.doubted:
            raise _NotPlain(f"{word.split('=', 1)[0]}, which the reaper does not follow")
        if name not in ours:
            if "=" in word or name in runtime.bools:
                at += 1
                continue
            if name in runtime.valued:
                # Go's flag package takes the next word whatever it is, but urfave/cli v1
                # (k3s's) first moves one that begins with "-" and is no flag to the end.
                if at + 1 < len(args) and args[at + 1].startswith("-"):
                    raise _NotPlain(f"{word} {args[at + 1]}: which its parser takes is not known")
                at += 2
                continue
            # A flag of the runtime's own: whether it takes the next word as its value is not
            # known here (a bool does not), nor so whether a flag after it is read as one.
            if any(flag_name(later) in ours for later in args[at + 1 :]):
                raise _NotPlain(f"whether {word} takes the word after it is not known")
            break
        if "=" in word:
            value = word.split("=", 1)[1]
        elif at + 1 < len(args):
            at += 1
            value = args[at]
        else:
            raise _NotPlain(f"{word} has no value")
        if not value.startswith("/"):
            raise _NotPlain(f"{word.split('=', 1)[0]} {value!r}: not an absolute path")
        if ".." in value.split("/"):
            # The runtime opens it as given: the kernel, not a lexical clean, resolves "..".
            raise _NotPlain(f"{word.split('=', 1)[0]} {value!r}: a '..' in it")
        found.append((name, value))
        at += 1
    names = {name for name, _ in found}
    for long, short in runtime.forms:
        if long in names and short in names:
            raise _NotPlain(f"both --{long} and -{short}: it does not start so")
    return found


# Where installers write units of their own: k3s's (INSTALL_K3S_NAME makes k3s-<name>.service)
# and RKE2's tarball's. Listed for more units of a runtime's name.
INSTALLERS_DIRS = ("/etc/systemd/system", "/usr/local/lib/systemd/system")


def with_installed_units(files: Files, runtimes: Sequence[RuntimeUnits]) -> list[RuntimeUnits]:
    """The runtimes, each with every `<binary>-<name>.service` an installer may have written
    for it (runtimes with subcommands: k3s and RKE2)."""
    names = []
    unlisted = []
    for unit_dir in INSTALLERS_DIRS:
        warned = len(files.warnings)
        names.extend(files.listing(unit_dir))
        if len(files.warnings) > warned:
            unlisted.append(unit_dir)
    found = []
    for runtime in runtimes:
        if not runtime.subcommands:
            found.append(runtime)
            continue
        more = [
            name
            for name, is_dir in names
            if name.startswith(f"{runtime.binary}-")
            and name.endswith(".service")
            and "@" not in name
            and not is_dir
            and name not in runtime.units
        ]
        installed = tuple(dict.fromkeys(more))
        found.append(
            runtime._replace(
                units=(*runtime.units, *installed), installed=installed, unlisted=tuple(unlisted)
            )
        )
    return found


def unit_files(files: Files, runtimes: Sequence[RuntimeUnits]) -> dict[str, UnitFiles]:
    """For each unit, the node paths systemd reads it from, in its order: the unit file, then
    its drop-ins by file name (none for a unit that is not there or is masked); and what could
    not be read or listed, or is an alias. Each dir of the search path is opened once, for
    every unit."""
    units = [unit for runtime in runtimes for unit in runtime.units]
    drop_in_dirs = {unit: _drop_in_dirs(unit) for unit in units}
    wanted = {*units, *(d for dirs in drop_in_dirs.values() for d in dirs)}
    mains: dict[str, str] = {}  # "" for a masked unit
    drop_ins: dict[str, dict[str, str]] = {unit: {} for unit in units}
    unread: dict[str, list[str]] = {unit: [] for unit in units}
    for unit_dir in UNIT_DIRS:
        present = files.lstat_in(unit_dir, wanted)
        for unit in units:
            if present is None:
                unread[unit].append(f"{files.path(unit_dir)}: not read")
                continue
            if unit in present and unit not in mains:
                target = present[unit]
                mains[unit] = "" if target == "/dev/null" else f"{unit_dir}/{unit}"
                if target and target != "/dev/null" and posixpath.basename(target) != unit:
                    where = files.path(f"{unit_dir}/{unit}")
                    unread[unit].append(f"{where}: an alias of {target}, whose drop-ins count")
            for name in drop_in_dirs[unit]:
                if name not in present:
                    continue
                warned = len(files.warnings)
                confs = [
                    entry
                    for entry, is_dir in files.listing(f"{unit_dir}/{name}")
                    if entry.endswith(".conf") and not entry.startswith(".") and not is_dir
                ]
                targets = files.lstat_in(f"{unit_dir}/{name}", confs) if confs else {}
                for entry in confs:
                    # A drop-in linked to /dev/null is masked: it hides the same name after it.
                    masked = targets is not None and targets.get(entry) == "/dev/null"
                    drop_ins[unit].setdefault(entry, "" if masked else f"{unit_dir}/{name}/{entry}")
                if len(files.warnings) > warned or targets is None:
                    unread[unit].append(f"{files.path(f'{unit_dir}/{name}')}: not read")
    found: dict[str, UnitFiles] = {}
    for unit in units:
        if not mains.get(unit):
            # Masked, or not there: nothing of it starts, unless it is in a dir not read.
            found[unit] = UnitFiles() if unit in mains else UnitFiles((), tuple(unread[unit]))
            continue
        ordered = sorted(drop_ins[unit], key=lambda name: name.encode("utf-8", "surrogateescape"))
        used = [drop_ins[unit][name] for name in ordered if drop_ins[unit][name]]
        found[unit] = UnitFiles((mains[unit], *used), tuple(unread[unit]))
    return found


def _drop_in_dirs(unit: str) -> list[str]:
    """The drop-in dirs of a unit: its own, its dash prefixes' (longest first), its type's."""
    name, _, kind = unit.rpartition(".")
    dirs = [f"{unit}.d"]
    while "-" in name:
        name = name.rsplit("-", 1)[0]
        dirs.append(f"{name}-.{kind}.d")
    return [*dirs, f"{kind}.d"]


class Reader:
    """The reading of the runtimes' units and of what they name, for one run: each file read
    once, all of them within one byte budget (past it, a file is not read: a warning)."""

    def __init__(self, files: Files) -> None:
        self.files = files
        self.left = MAX_UNIT_BYTES
        self._texts: dict[str, tuple[str | None, bool]] = {}
        self._data: dict[str, tuple[bytes | None, bool]] = {}
        self._links: dict[str, dict[str, str] | None] = {}
        self._listings: dict[str, tuple[list[tuple[str, bool]], bool]] = {}

    def text(self, node_path: str, language: str) -> tuple[str | None, bool]:
        """The file's text (None where it is not there or not read), and whether it could not
        be read (then its warning is said, once)."""
        if node_path not in self._texts:
            read = functools.partial(self.files.text, node_path, language)
            self._texts[node_path] = self._counted(node_path, read)
        return self._texts[node_path]

    def data(self, node_path: str) -> tuple[bytes | None, bool]:
        """The file's bytes, as text() has its text."""
        if node_path not in self._data:
            read_data = functools.partial(self.files.data, node_path)
            self._data[node_path] = self._counted(node_path, read_data)
        return self._data[node_path]

    def listing(self, node_dir: str) -> tuple[list[tuple[str, bool]], bool]:
        """A dir's entries (name, whether a dir), and whether it could not be listed (then its
        warning is said, once)."""
        if node_dir not in self._listings:
            warned = len(self.files.warnings)
            listed = self.files.listing(node_dir)
            self._listings[node_dir] = (listed, len(self.files.warnings) > warned)
        return self._listings[node_dir]

    def links(self, node_dir: str) -> dict[str, str] | None:
        if node_dir not in self._links:
            self._links[node_dir] = self.files.links(node_dir)
        return self._links[node_dir]

    def _counted(
        self, node_path: str, read: Callable[[], AnyStr | None]
    ) -> tuple[AnyStr | None, bool]:
        warnings = self.files.warnings
        warned = len(warnings)
        if self.left <= 0:
            warnings.append(f"{self.files.path(node_path)}: over {MAX_UNIT_BYTES} bytes of units")
            return None, True
        found = read()
        self.left -= len(found) if found is not None else 0
        return found, len(warnings) > warned


def runtime_flags(
    reader: Reader, runtime: RuntimeUnits, paths_by_unit: dict[str, UnitFiles]
) -> UnitFlags:
    """What a runtime's units pass: the followed flags' values, from the ExecStart= line
    systemd runs; or, for anything the reaper cannot be sure of, a doubt."""
    files = reader.files
    values: list[tuple[str, str, str]] = []
    doubts = [
        f"{files.path(d)}: not listed for units of {runtime.binary}" for d in runtime.unlisted
    ]
    started = []
    for unit in runtime.units:
        read = paths_by_unit.get(unit, UnitFiles())
        if not read.paths:
            doubts.extend(read.unread)  # a unit that may be in a dir not read
            continue
        said = _unit_says(reader, runtime, unit, read)
        if said is None:
            continue  # an installer's unit of another command (k3s crictl ...), or masked
        started.append(unit)
        values.extend(said.values)
        doubts.extend(said.doubts)
    if values and len(started) > 1:
        doubts.append(f"{', '.join(started)}: which of them starts is not known")
    if started:
        doubts.extend(_aliases(reader, started))
    if started and runtime.every_variable:
        doubts.extend(_default_environment(reader, runtime.every_variable))
    return UnitFlags(tuple(values), tuple(doubts), tuple(started))


def _unit_says(
    reader: Reader, runtime: RuntimeUnits, unit: str, read: UnitFiles
) -> UnitFlags | None:
    """What one unit passes; None for a unit that does not start the runtime: masked by an
    empty file, or an installer's unit that runs another command."""
    files = reader.files
    values: list[tuple[str, str, str]] = []
    doubts = list(read.unread)
    commands: list[tuple[str, str]] = []
    environment = _Environment()
    for node_path in read.paths:
        where = files.path(node_path)
        text, unread = reader.text(node_path, "a unit")
        if text is None:
            doubts.append(f"{where}: not read" if unread else where)
            continue
        if node_path == read.paths[0] and not text:
            return None  # an empty unit file masks it
        try:
            lines = read_unit(text)
        except _NotPlain as e:
            doubts.append(f"{where}: {e}")
            continue
        for command in lines.exec_start:
            if command:
                commands.append((command, where))
            else:
                commands.clear()
        doubts.extend(f"{where}: {remap}" for remap in lines.remaps)
        for setting in lines.environment if runtime.variables else ():
            if may_name(setting, runtime.variables):
                doubts.append(f"{where}: Environment= {setting}")
        environment.settings.extend((setting, where) for setting in lines.environment)
        environment.files.extend((_specifiers(v, unit), where) for v in lines.environment_files)
        for change in lines.environment_changes:
            # PassEnvironment= passes on PID 1's own, which the kernel's command line sets.
            if runtime.every_variable and may_name(change, runtime.every_variable):
                doubts.append(f"{where}: {change}")
    if len(commands) > 1:
        doubts.append(f"{commands[-1][1]}: {len(commands)} ExecStart= lines")
    for command, where in commands[-1:]:
        try:
            expand = None
            if runtime.expanded and "$" in command:
                expand = _expanded(reader, runtime.expanded, environment)
            passed = command_flags(command, runtime, expand)
        except _NotTheRuntime as e:
            if unit in runtime.installed:
                return None
            doubts.append(f"{where}: ExecStart= not followed: {e}")
            continue
        except _NotPlain as e:
            doubts.append(f"{where}: ExecStart= not followed: {e}")
            continue
        values.extend((flag, value, f"{where}: ExecStart= {flag}") for flag, value in passed)
    if runtime.variables:
        named = [value for value, _ in environment.files if value]
        doubts.extend(_environment_files(reader, unit, named, runtime.variables))
    return UnitFlags(tuple(values), tuple(doubts))


class _Environment:
    """A unit's settings of its environment, from its file and drop-ins in order."""

    def __init__(self) -> None:
        self.settings: list[tuple[str, str]] = []  # (Environment= value, where)
        self.files: list[tuple[str, str]] = []  # (EnvironmentFile= value, where)


def _expanded(reader: Reader, names: Sequence[str], environment: _Environment) -> dict[str, str]:
    """The values the service's environment gives names, "" for one not set: Environment=
    first, then the environment files in order, each overriding what came before
    (systemd.exec(5)). Raises _NotPlain where any of it cannot be read for sure."""
    values = dict.fromkeys(names, "")
    for setting, where in environment.settings:
        if not setting:
            values = dict.fromkeys(names, "")
            continue
        if not may_name(setting, names):
            continue
        if any(char in setting for char in "\\%$"):
            raise _NotPlain(f"{where}: Environment= {setting}: an escape, a specifier or a $")
        for word in _assignments(setting):
            name, equals, value = word.partition("=")
            if not equals:
                raise _NotPlain(f"{where}: Environment= {setting}: {word!r} sets nothing")
            if name in values:
                values[name] = value
    named: list[tuple[str, str]] = []
    for value, where in environment.files:
        named = [] if not value else [*named, (value, where)]
    files = reader.files
    for value, where in named:
        path = _environment_file_path(value)
        if path is None:
            raise _NotPlain(f"{where}: EnvironmentFile={value}, not followed")
        if ".." in path.split("/"):
            raise _NotPlain(f"{where}: EnvironmentFile={value}: systemd ignores it, a '..' in it")
        text, unread = reader.text(posixpath.normpath(path), "a file of settings")
        if unread:
            raise _NotPlain(f"{files.path(path)}: not read")
        if text is None:
            if value.startswith("-"):
                continue
            raise _NotPlain(f"{files.path(path)}: missing, and {where} needs it")
        try:
            assignments = environment_file(text)
        except _NotPlain as e:
            raise _NotPlain(f"{files.path(path)}: {e}") from None
        for name, setting in assignments:
            if name in values:
                values[name] = setting
    return values


# Compiled where first used (re keeps them): a node without such a unit never pays for it.
_ENV_NAME = "[A-Za-z_][A-Za-z0-9_]*="
# An Environment= word: quoted whole, or NAME= then a value quoted to the word's end, or bare.
_ASSIGNMENT = (
    r"""[ \t]*(?:"([^"]*)"|'([^']*)'"""
    r"""|([A-Za-z_][A-Za-z0-9_]*=)(?:"([^"]*)"|'([^']*)')|([^ \t"']+))(?=[ \t]|$)"""
)


def _assignments(setting: str) -> list[str]:
    """The words of an Environment= value, unquoted as systemd does where a quote opens the
    word or its value. Raises _NotPlain for any other quote."""
    words = []
    at = 0
    while setting[at:].strip(" \t"):
        found = re.compile(_ASSIGNMENT).match(setting, at)
        if found is None:
            raise _NotPlain(f"Environment= {setting}: a quote inside a word")
        words.append("".join(part for part in found.groups() if part is not None))
        at = found.end()
    return words


def environment_file(text: str) -> list[tuple[str, str]]:
    """The assignments of a plain environment file, in order: `NAME=value` lines, the value
    bare or quoted whole, and comment lines. Raises _NotPlain for anything systemd's parser
    could read otherwise: a backslash anywhere (it continues a line, a comment too), a quote
    within a value, a key with blanks, a line that is no assignment."""
    # systemd keeps a byte order mark: it is part of the first key, which is then no name.
    if any(char in text for char in _NOT_PLAIN_TEXT) or "\\" in text:
        raise _NotPlain("a backslash, a NUL or a line break read otherwise")
    found = []
    for number, line in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        stripped = line.strip(" \t")
        if not stripped or stripped.startswith(("#", ";")):
            continue
        key = re.match(_ENV_NAME, stripped)
        if key is None:
            raise _NotPlain(f"line {number}: not a plain NAME=value")
        value = stripped[key.end() :].lstrip(" \t")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if any(char in value for char in "'\"$#;"):
            raise _NotPlain(f"line {number}: a quote, a $, a # or a ; within its value")
        found.append((key.group()[:-1], value))
    return found


def _environment_file_path(value: str) -> str | None:
    """The path an EnvironmentFile= value names (its "-" dropped), or None where it is not
    one path the reader can take: relative, a glob, a specifier, a NUL."""
    path = value[1:] if value.startswith("-") else value
    if not path.startswith("/") or any(char in path for char in "%*?[\0"):
        return None
    return path


def _aliases(reader: Reader, units: list[str]) -> list[str]:
    """Other names linked to the units whose drop-ins systemd reads too: those with drop-in
    dirs of their own (crio.service's packaged Alias=cri-o.service has none)."""
    files = reader.files
    linked: dict[str, str] = {}  # name: the name its link leads to, the first dir's
    said = []
    for unit_dir in UNIT_DIRS:
        links = reader.links(unit_dir)
        if links is None:
            said.append(f"{files.path(unit_dir)}: not listed for names of {', '.join(units)}")
            continue
        for name, target in links.items():
            if name.endswith(".service"):
                linked.setdefault(name, posixpath.basename(target))
    aliases: dict[str, str] = {}  # name: its unit
    for name in linked:
        unit = name
        for _ in range(8):  # systemd follows a chain of links so far (FOLLOW_MAX)
            unit = linked.get(unit, unit)
        if unit in units and name not in units:
            aliases[name] = unit
    for name, unit in aliases.items():
        own = [d for d in _drop_in_dirs(name) if d not in _drop_in_dirs(unit)]
        for unit_dir in UNIT_DIRS:
            present = files.lstat_in(unit_dir, own)
            if present is None or present:
                where = files.path(f"{unit_dir}/{next(iter(present or own))}")
                said.append(f"{where}: drop-ins of {name}, another name of {unit}")
    return said


def _default_environment(reader: Reader, variables: Sequence[str]) -> list[str]:
    """systemd's own DefaultEnvironment= (system.conf and its drop-ins), and the kernel's
    command line (systemd.setenv=, and PID 1's own environment, which PassEnvironment= passes
    on), which every service gets: one of variables there moves the runtime's records."""
    confs = [*SYSTEM_CONFS, "/proc/cmdline"]
    for conf_dir in SYSTEM_CONF_DIRS:
        listed, _ = reader.listing(conf_dir)
        confs.extend(f"{conf_dir}/{n}" for n, _ in listed if n.endswith(".conf"))
    said = [said for conf in confs if (said := _sets(reader, conf, variables, words=True))]
    return said + _generators(reader, variables)


def _generators(reader: Reader, variables: Sequence[str]) -> list[str]:
    """Environment generators that may set one of variables: those whose bytes name it (a
    script, or a program built with the name in it). Ubuntu's snapd and Fedora's flatpak ship
    one; what such a program prints cannot be known without running it."""
    files = reader.files
    said = []
    names = [v.encode() for v in variables]
    for generator_dir in ENVIRONMENT_GENERATOR_DIRS:
        listed, unread = reader.listing(generator_dir)
        if unread:
            said.append(f"{files.path(generator_dir)}: not read")
        for name in (n for n, is_dir in listed if not is_dir):
            node_path = f"{generator_dir}/{name}"
            data, unread = reader.data(node_path)
            if unread:
                said.append(f"{files.path(node_path)}: not read")
            elif data is not None and any(v in data for v in names):
                said.append(f"{files.path(node_path)}: may set {' or '.join(variables)}")
    return said


def _environment_files(
    reader: Reader, unit: str, named: list[str], variables: Sequence[str]
) -> list[str]:
    """Why the environment files of a unit may set variables: those it names (EnvironmentFile=
    values), and the installers' own, looked at even where it does not name them."""
    name = unit.rsplit(".", 1)[0]
    usual = [f"/etc/systemd/system/{unit}.env", f"/etc/default/{name}", f"/etc/sysconfig/{name}"]
    said = []
    seen = set()
    for env_file in [*named, *usual]:
        path = _environment_file_path(env_file)
        if path is None:
            said.append(f"{unit}: EnvironmentFile={env_file}, not followed")
            continue
        clean = posixpath.normpath(path)
        if clean in seen:
            continue
        seen.add(clean)
        sets = _sets(reader, clean, variables, words=False)
        if sets:
            said.append(sets)
    return said


def may_name(words: str, variables: Sequence[str]) -> bool:
    """Whether words systemd unquotes, unescapes and expands specifiers in (a unit's
    Environment=, UnsetEnvironment=, PassEnvironment=, DefaultEnvironment=, the kernel's
    command line) may name one of variables: as written, with their quotes taken out, or
    through any escape or specifier, which may spell a name."""
    bare = words.replace('"', "").replace("'", "")
    return "\\" in words or "%" in words or any(v in bare for v in variables)


def _sets(reader: Reader, node_path: str, variables: Sequence[str], words: bool) -> str:
    """Why a file of settings may set one of variables ("" when it cannot): an environment
    file names them as written (its keys are taken as they are), systemd's own config and
    the kernel's command line (words) maybe otherwise; a comment line of the config does not."""
    text, unread = reader.text(node_path, "a file of settings")
    where = reader.files.path(node_path)
    if unread:
        return f"{where}: not read"
    if text is None:
        return ""
    if words:
        lines = text.replace("\r", "\n").split("\n")
        said = [line for line in lines if not line.lstrip(" \t").startswith(("#", ";"))]
        found = may_name("\n".join(said), variables)
    else:
        found = any(v in text for v in variables)
    return f"{where}: sets {' or '.join(variables)}" if found else ""


def _specifiers(value: str, unit: str) -> str:
    """%N and %n of a unit's setting, the only specifiers an installer's units use here."""
    return value.replace("%N", unit.rsplit(".", 1)[0]).replace("%n", unit)
