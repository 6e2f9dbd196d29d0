"""What a runtime's systemd unit passes on its command line: the flags that move where the
runtime keeps its records, followed where the command line is plain, and otherwise a reason to
doubt those records (inventory.py then calls no sandbox forgotten).

Facts (systemd.unit(5), systemd.service(5), systemd.syntax(7)): systemd reads a unit from the
first dir of its search path that has it (a symlink to /dev/null masks it), then the
`<unit>.d/*.conf` drop-ins of every dir, in file name order, a name in an earlier dir hiding
the same name in a later one. An `ExecStart=` with an empty value drops the ones before it. A
line ending in a backslash goes on in the next; `#` and `;` start comment lines; words are
split at blanks, a word may be quoted whole in '...' or "..."; `$VAR` and `${VAR}` expand from
the environment, `%` starts a specifier. containerd takes `--root`, `--config`/`-c`, `--state`
and `--address`/`-a`; k3s and RKE2 `--data-dir`/`-d` and `--config`/`-c`, and their config
file from `K3S_CONFIG_FILE`/`RKE2_CONFIG_FILE`. Go's flag package, under both, takes one dash
or two and `--flag value` or `--flag=value`. The k3s installer writes each of its arguments
on a line of its own in single quotes; stock units (Debian's containerd, the k3s and RKE2
installers') pass none of these flags unless the operator asked for them.
"""

from __future__ import annotations

from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Iterable
    from typing import Protocol

    class Files(Protocol):
        """How units are read: config.py's reader of the node's files, inside its root."""

        root: str
        warnings: list[str]

        def path(self, node_path: str) -> str: ...

        def text(self, node_path: str, language: str) -> str | None: ...

        def listing(self, node_dir: str) -> list[tuple[str, bool]]: ...

        def lstat_in(self, node_dir: str, names: Iterable[str]) -> dict[str, str] | None: ...


# The system unit search path's dirs that hold units at boot, in systemd's order.
UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)
_UNPLAIN = "'\"\\$%"  # quotes inside a word, escapes, variables, specifiers


class UnitLines(Record):
    """The settings of a unit file or drop-in that matter here."""

    exec_start: tuple[str, ...]  # as written; "" for an ExecStart= that drops those before
    environment: tuple[str, ...]  # Environment= values
    environment_files: tuple[str, ...]  # EnvironmentFile= values, a leading "-" dropped


class UnitFlags(Record):
    """What a runtime's units say: each followed flag's value with where it was set, in
    command-line order, and why its records are in doubt (empty: they are not)."""

    values: tuple[tuple[str, str, str], ...]  # (flag name, value, where)
    doubts: tuple[str, ...]


def read_unit(text: str) -> UnitLines:
    """The [Service] settings of one unit file or drop-in."""
    exec_start: list[str] = []
    environment: list[str] = []
    environment_files: list[str] = []
    section = ""
    pending = ""
    for raw in [*text.splitlines(), ""]:  # the "": a continuation at the end of the file
        line = pending + raw
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("["):
            section = stripped
            continue
        if section != "[Service]" or "=" not in stripped:
            continue
        key, value = (part.strip() for part in stripped.split("=", 1))
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


def flags_named(command: str, flags: Collection[str]) -> list[str]:
    """The flags of flags that a command line may pass, read loosely (the quotes dropped from
    each blank-separated word), and "$" where it expands a variable, which may hold any."""
    found: list[str] = []
    for word in command.split():
        name = flag_name(word.replace("'", "").replace('"', ""))
        if name is not None and name in flags and name not in found:
            found.append(name)
    if "$" in command:
        found.append("$")
    return found


def command_words(command: str) -> list[str] | None:
    """The words of an ExecStart= command line as systemd splits them, for its plain part:
    bare words, and words quoted whole, with no quote, backslash, "$" or "%" inside; None for
    anything else, and for a command with a prefix that changes its argv (@)."""
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
                return None
            word, at = command[at + 1 : end], end + 1
        else:
            end = at
            while end < len(command) and command[end] not in " \t":
                end += 1
            word, at = command[at:end], end
        if any(char in _UNPLAIN for char in word):
            return None
        words.append(word)
    if words and not words[0].lstrip("-+!:"):
        return None
    if words and words[0].startswith("@"):
        return None
    return words


def flag_values(words: Iterable[str], flags: Collection[str]) -> list[tuple[str, str]] | None:
    """Each (flag, value) of flags on a command line, in order; None where one has no value."""
    found = []
    pending: str | None = None
    for word in words:
        if pending is not None:
            found.append((pending, word))
            pending = None
            continue
        name = flag_name(word)
        if name in flags:
            assert name is not None
            if "=" in word:
                found.append((name, word.split("=", 1)[1]))
            else:
                pending = name
    return None if pending is not None else found


def unit_files(files: Files, units: Collection[str]) -> dict[str, list[str]]:
    """For each unit, the node paths systemd reads it from, in its order: the unit file (from
    the first dir that has it, none if masked), then every drop-in by file name. A dir that
    cannot be read or listed is in the list itself: reading it fails, with its warning. Each
    dir of the search path is opened once, for every unit."""
    mains: dict[str, str] = {}  # "" for a masked unit
    drop_ins: dict[str, dict[str, str]] = {unit: {} for unit in units}
    unreadable: list[str] = []
    for unit_dir in UNIT_DIRS:
        present = files.lstat_in(unit_dir, [*units, *(f"{unit}.d" for unit in units)])
        if present is None:
            unreadable.append(unit_dir)
            continue
        for unit in units:
            if unit in present and unit not in mains:
                mains[unit] = "" if present[unit] == "/dev/null" else f"{unit_dir}/{unit}"
            if f"{unit}.d" not in present:
                continue
            warned = len(files.warnings)
            for name, is_dir in files.listing(f"{unit_dir}/{unit}.d"):
                if name.endswith(".conf") and not is_dir:
                    drop_ins[unit].setdefault(name, f"{unit_dir}/{unit}.d/{name}")
            if len(files.warnings) > warned:
                unreadable.append(f"{unit_dir}/{unit}.d")
    found: dict[str, list[str]] = {}
    for unit in units:
        if mains.get(unit) == "":
            found[unit] = []  # masked: its drop-ins start nothing either
            continue
        main = [mains[unit]] if unit in mains else []
        found[unit] = main + [drop_ins[unit][name] for name in sorted(drop_ins[unit])] + unreadable
    return found


def runtime_flags(
    files: Files,
    paths_by_unit: dict[str, list[str]],
    followed: Collection[str],
    doubted: Collection[str],
    config_variable: str | None,
) -> UnitFlags:
    """What a runtime's units pass: the followed flags' values, from the ExecStart= lines
    systemd runs; and a doubt for a doubted flag, a command line not plain enough to read, a
    unit that could not be read, or the config variable set in the environment."""
    values: list[tuple[str, str, str]] = []
    doubts: list[str] = []
    for unit, node_paths in paths_by_unit.items():
        commands: list[tuple[str, str]] = []
        env_files: list[str] = []
        for node_path in node_paths:
            where = files.path(node_path)
            text = files.text(node_path, "a unit")
            if text is None:
                doubts.append(f"{where}: not read")
                continue
            lines = read_unit(text)
            for command in lines.exec_start:
                if not command:
                    commands.clear()
                else:
                    commands.append((command, where))
            if config_variable and any(config_variable in v for v in lines.environment):
                doubts.append(f"{where}: Environment= sets {config_variable}")
            env_files.extend(_specifiers(v, unit) for v in lines.environment_files)
        for command, where in commands:
            named = flags_named(command, (*followed, *doubted))
            if not named:
                continue
            words = command_words(command)
            passed = flag_values(words, followed) if words is not None else None
            if "$" in named or passed is None:
                doubts.append(f"{where}: ExecStart= passes {', '.join(named)}, not plainly")
                continue
            values.extend((flag, value, f"{where}: ExecStart= --{flag}") for flag, value in passed)
            doubts.extend(f"{where}: ExecStart= passes {f}" for f in named if f in doubted)
        if config_variable and node_paths:
            doubts.extend(_config_variable_set(files, unit, env_files, config_variable))
    return UnitFlags(tuple(values), tuple(doubts))


def _config_variable_set(files: Files, unit: str, env_files: list[str], variable: str) -> list[str]:
    """The environment files that set variable: those the unit names, and the installers' own,
    looked at even where the unit does not name them."""
    name = unit.rsplit(".", 1)[0]
    usual = [f"/etc/systemd/system/{unit}.env", f"/etc/default/{name}", f"/etc/sysconfig/{name}"]
    said = []
    for env_file in dict.fromkeys([*env_files, *usual]):
        if not env_file.startswith("/") or "%" in env_file:
            continue
        text = files.text(env_file, "an environment file")
        if text is not None and variable in text:
            said.append(f"{files.path(env_file)}: sets {variable}")
    return said


def _specifiers(value: str, unit: str) -> str:
    """%N and %n of a unit's setting, the only specifiers an installer's units use here."""
    return value.replace("%N", unit.rsplit(".", 1)[0]).replace("%n", unit)
