"""What a runtime's systemd unit passes on its command line that moves where it keeps its
records: flags the reaper does not follow, so that their presence alone puts that runtime's
records in doubt (inventory.py then calls no sandbox forgotten).

Facts: systemd reads a unit from the first dir of its search path that has it, then every
`<unit>.d/*.conf` drop-in of every dir (systemd.unit(5)); a symlink to /dev/null masks it. An
`ExecStart=` with an empty value resets the list (systemd.service(5)): every ExecStart= of
every file is read all the same, so a flag a later file drops still counts, which only errs
toward doubt. A line ending in a backslash goes on in the next one;
`#` and `;` start comment lines; `$VAR` and `${VAR}` in ExecStart= expand from Environment=
and EnvironmentFile=; `%N` is the unit's name without its type suffix. containerd takes
`--root` and `--config`/`-c`; k3s and RKE2 `--data-dir`/`-d` and `--config`/`-c`, and their
config file from `K3S_CONFIG_FILE`/`RKE2_CONFIG_FILE`. Stock units (Debian's containerd, the
k3s and RKE2 installers') pass none of these.
"""

from __future__ import annotations

from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection

# The system unit search path's dirs that hold units at boot, in systemd's order.
UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)


class UnitLines(Record):
    """The settings of a unit file or drop-in that matter here."""

    exec_start: tuple[str, ...]  # as written, prefixes and all
    environment: tuple[str, ...]  # Environment= values
    environment_files: tuple[str, ...]  # EnvironmentFile= values, a leading "-" dropped


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
        if key == "ExecStart" and value:
            exec_start.append(value)
        elif key == "Environment":
            environment.append(value)
        elif key == "EnvironmentFile" and value:
            environment_files.append(value[1:] if value.startswith("-") else value)
    return UnitLines(tuple(exec_start), tuple(environment), tuple(environment_files))


def flags_passed(command: str, flags: Collection[str]) -> list[str]:
    """The flags of flags that a command line passes (`--flag value` or `--flag=value`), and
    "$" where it expands a variable, which may hold any of them."""
    found = []
    for word in command.split():
        name = word.strip("'\"").split("=", 1)[0]
        if name in flags and name not in found:
            found.append(name)
    if "$" in command:
        found.append("$")
    return found


def unit_name_specifier(value: str, unit: str) -> str:
    """%N and %n of a unit's setting, the only specifiers an installer's units use here."""
    return value.replace("%N", unit.rsplit(".", 1)[0]).replace("%n", unit)
