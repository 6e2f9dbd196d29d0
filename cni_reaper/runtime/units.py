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
  environment into `/etc/systemd/system/<unit>.env`.
"""

from __future__ import annotations

import posixpath

from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Protocol

    class Files(Protocol):
        """How units are read: config.py's reader of the node's files, inside its root."""

        root: str
        warnings: list[str]

        def path(self, node_path: str) -> str: ...

        def text(self, node_path: str, language: str) -> str | None: ...

        def listing(self, node_dir: str) -> list[tuple[str, bool]]: ...

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
_NOT_PLAIN_TEXT = "\0\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # line ends systemd and Python disagree on
_NOT_PLAIN_COMMAND = "\\$%"  # escapes, variables, specifiers
_EXEC_PREFIXES = "-@:+!|"
MAX_UNIT_BYTES = 1 << 20  # a runtime's units and drop-ins together


class RuntimeUnits(Record):
    """How one runtime is started by systemd, and what of its command line the reaper reads."""

    units: tuple[str, ...]
    binary: str  # the executable's file name
    subcommands: tuple[str, ...]  # one of them comes first (k3s: server, agent); () none
    followed: tuple[str, ...]  # flag names whose values are taken
    forms: tuple[tuple[str, str], ...]  # the long and short names of one flag
    doubted: tuple[str, ...]  # flag names that put the records in doubt
    variables: tuple[str, ...]  # environment variables that do so


class UnitFlags(Record):
    """What a runtime's units say: each followed flag's value with where it was set, in
    command-line order, and why its records are in doubt (empty: they are not)."""

    values: tuple[tuple[str, str, str], ...]  # (flag name, value, where)
    doubts: tuple[str, ...]


class _NotPlain(Exception):
    """A unit, or a line of it, that could be read otherwise than the reaper reads it."""


class UnitLines(Record):
    """The settings of a unit file or drop-in that matter here."""

    exec_start: tuple[str, ...]  # as written; "" for an ExecStart= that drops those before
    environment: tuple[str, ...]  # Environment= values
    environment_files: tuple[str, ...]  # EnvironmentFile= values, a leading "-" dropped


def read_unit(text: str) -> UnitLines:
    """The [Service] settings of one unit file or drop-in. Raises _NotPlain."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if any(char in text for char in _NOT_PLAIN_TEXT):
        raise _NotPlain("a NUL or a line break Python and systemd read differently")
    exec_start: list[str] = []
    environment: list[str] = []
    environment_files: list[str] = []
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
            section = whole
            continue
        if section != "[Service]" or "=" not in whole:
            continue
        key, value = (part.strip(" \t\n\r") for part in whole.split("=", 1))
        if key == "ExecStart":
            exec_start.append(value)
        elif key == "Environment":
            environment.append(value)
        elif key == "EnvironmentFile" and value:
            environment_files.append(value[1:] if value.startswith("-") else value)
    return UnitLines(tuple(exec_start), tuple(environment), tuple(environment_files))


def flag_name(word: str) -> str | None:
    """The flag a command-line word names (one dash or two, up to an "="), or None."""
    if not word.startswith("-") or word.startswith("---") or word in ("-", "--"):
        return None
    return word.lstrip("-").split("=", 1)[0]


def command_words(command: str) -> list[str]:
    """The words of a plain ExecStart= command line: bare, or quoted whole. Raises _NotPlain
    for an escape, a variable, a specifier, or a quote inside a word."""
    if any(char in command for char in _NOT_PLAIN_COMMAND):
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
            if "'" in word or '"' in word:
                raise _NotPlain("a quote inside a word")
        else:
            end = at
            while end < len(command) and command[end] not in " \t":
                end += 1
            word, at = command[at:end], end
            if "'" in word or '"' in word:
                raise _NotPlain("a quote inside a word")
        words.append(word)
    return words


def command_flags(command: str, runtime: RuntimeUnits) -> list[tuple[str, str]]:
    """The followed flags an ExecStart= command line gives the runtime, as its flag parser
    takes them, in order. Raises _NotPlain where the reaper cannot be sure of that."""
    words = command_words(command)
    if not words:
        raise _NotPlain("no command")
    first = words[0]
    prefix = first[: len(first) - len(first.lstrip(_EXEC_PREFIXES))]
    if "@" in prefix:
        raise _NotPlain("the @ prefix: argv[0] is another word")
    if posixpath.basename(first[len(prefix) :]) != runtime.binary:
        raise _NotPlain(f"{first[len(prefix) :]!r} is not {runtime.binary} itself")
    args = words[1:]
    if runtime.subcommands:
        if not args or args[0] not in runtime.subcommands:
            raise _NotPlain(f"not {' or '.join(runtime.subcommands)} first")
        args = args[1:]
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
            if "=" in word:
                at += 1
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
    names = [(n, d) for unit_dir in INSTALLERS_DIRS for n, d in files.listing(unit_dir)]
    found = []
    for runtime in runtimes:
        more = [
            name
            for name, is_dir in names
            if runtime.subcommands
            and name.startswith(f"{runtime.binary}-")
            and name.endswith(".service")
            and "@" not in name
            and not is_dir
            and name not in runtime.units
        ]
        found.append(runtime._replace(units=(*runtime.units, *dict.fromkeys(more))))
    return found


def unit_files(files: Files, runtimes: Sequence[RuntimeUnits]) -> dict[str, list[str]]:
    """For each unit, the node paths systemd reads it from, in its order: the unit file, then
    its drop-ins by file name; [] for a unit that is not there or is masked. A path in a list
    that is a dir means it could not be listed: reading it fails, with its warning. Each dir of
    the search path is opened once, for every unit."""
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
                unread[unit].append(unit_dir)
                continue
            if unit in present and unit not in mains:
                target = present[unit]
                if target == "/dev/null":
                    mains[unit] = ""
                elif target and posixpath.basename(target) != unit:
                    mains[unit] = f"{unit_dir}/{unit}"
                    unread[unit].append(f"{unit_dir}/{unit} (an alias of {target})")
                else:
                    mains[unit] = f"{unit_dir}/{unit}"
            for name in drop_in_dirs[unit]:
                if name not in present:
                    continue
                warned = len(files.warnings)
                for entry, is_dir in files.listing(f"{unit_dir}/{name}"):
                    if entry.endswith(".conf") and not entry.startswith(".") and not is_dir:
                        drop_ins[unit].setdefault(entry, f"{unit_dir}/{name}/{entry}")
                if len(files.warnings) > warned:
                    unread[unit].append(f"{unit_dir}/{name}")
    found: dict[str, list[str]] = {}
    for unit in units:
        if not mains.get(unit):
            found[unit] = [] if unit in mains or not unread[unit] else unread[unit]
            continue
        ordered = sorted(drop_ins[unit], key=lambda name: name.encode("utf-8", "surrogateescape"))
        found[unit] = [mains[unit], *(drop_ins[unit][name] for name in ordered), *unread[unit]]
    return found


def _drop_in_dirs(unit: str) -> list[str]:
    """The drop-in dirs of a unit: its own, its dash prefixes' (longest first), its type's."""
    name, _, kind = unit.rpartition(".")
    dirs = [f"{unit}.d"]
    while "-" in name:
        name = name.rsplit("-", 1)[0]
        dirs.append(f"{name}-.{kind}.d")
    return [*dirs, f"{kind}.d"]


def runtime_flags(
    files: Files, runtime: RuntimeUnits, paths_by_unit: dict[str, list[str]]
) -> UnitFlags:
    """What a runtime's units pass: the followed flags' values, from the ExecStart= line
    systemd runs; or, for anything the reaper cannot be sure of, a doubt."""
    values: list[tuple[str, str, str]] = []
    doubts: list[str] = []
    started = [unit for unit in runtime.units if paths_by_unit.get(unit)]
    read = 0
    for unit in started:
        commands: list[tuple[str, str]] = []
        env_files: list[str] = []
        for node_path in paths_by_unit[unit]:
            where = files.path(node_path)
            if " (an alias of " in node_path:
                doubts.append(f"{where}: its drop-ins are those of another name too")
                continue
            warned = len(files.warnings)
            text = files.text(node_path, "a unit")
            if text is None:
                doubts.append(f"{where}: not read" if len(files.warnings) > warned else where)
                continue
            read += len(text)
            if read > MAX_UNIT_BYTES:
                doubts.append(f"{where}: over {MAX_UNIT_BYTES} bytes of units; not read")
                break
            if node_path == paths_by_unit[unit][0] and not text:
                break  # an empty unit file masks it
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
            for setting in lines.environment if runtime.variables else ():
                if "\\" in setting or any(v in setting for v in runtime.variables):
                    doubts.append(f"{where}: Environment= {setting}")
            env_files.extend(_specifiers(v, unit) for v in lines.environment_files)
        if len(commands) > 1:
            doubts.append(f"{commands[-1][1]}: {len(commands)} ExecStart= lines")
        for command, where in commands[-1:]:
            try:
                passed = command_flags(command, runtime)
            except _NotPlain as e:
                doubts.append(f"{where}: ExecStart= not followed: {e}")
                continue
            values.extend((flag, value, f"{where}: ExecStart= {flag}") for flag, value in passed)
        if runtime.variables:
            doubts.extend(_environment_files(files, unit, env_files, runtime.variables))
    if values and len(started) > 1:
        doubts.append(f"{', '.join(started)}: which of them starts is not known")
    return UnitFlags(tuple(values), tuple(doubts))


def _environment_files(
    files: Files, unit: str, named: list[str], variables: Sequence[str]
) -> list[str]:
    """Why the environment files of a unit may set variables: those it names, and the
    installers' own, looked at even where it does not name them."""
    name = unit.rsplit(".", 1)[0]
    usual = [f"/etc/systemd/system/{unit}.env", f"/etc/default/{name}", f"/etc/sysconfig/{name}"]
    said = []
    for env_file in dict.fromkeys([*named, *usual]):
        if not env_file.startswith("/") or any(c in env_file for c in "%*?[\0"):
            said.append(f"{unit}: EnvironmentFile={env_file}, not followed")
            continue
        warned = len(files.warnings)
        text = files.text(env_file, "an environment file")
        if len(files.warnings) > warned:
            said.append(f"{files.path(env_file)}: not read")
        elif text is not None and any(v in text for v in variables):
            said.append(f"{files.path(env_file)}: sets {' or '.join(variables)}")
    return said


def _specifiers(value: str, unit: str) -> str:
    """%N and %n of a unit's setting, the only specifiers an installer's units use here."""
    return value.replace("%N", unit.rsplit(".", 1)[0]).replace("%n", unit)
