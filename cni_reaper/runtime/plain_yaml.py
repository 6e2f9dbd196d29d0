r"""The top-level string settings of a YAML config file, read without a YAML library.

k3s's and RKE2's config.yaml is a YAML mapping from flag names to values. The reaper needs one
of them, the data dir, and ships no YAML parser (its dependencies are pyudev and
systemd-python, both optional). settings() reads the keys of the top-level block mapping of
the first document, and the value of each key asked for when that value is a string on the
key's own line: a plain path (YAML reads many plain words, `true`, `~`, `1e3`, as no string),
single-quoted, or double-quoted with no escape but \\ and \" (go-yaml v2, k3s's, refuses \/).
Keys are matched as k3s makes flags of them (k3s_flag()). Anything that could make a YAML
parser, or k3s after it, see another top-level mapping than the lines show, or another value
for a key asked for, raises Unreadable instead of being guessed at:

- a document that is not a block mapping at column 0 (a flow mapping, a sequence, an indented
  mapping, a directive);
- a merge key (`<<`), a complex key (`?`), a key with an anchor or a tag, a line that is not
  `key: value` (or, below a key without a value, `- item`), a line indented by a tab;
- a key k3s trims (blanks, Unicode spaces) or splits at an "=" into a key asked for;
- a value of any key that opens a quoted string or a flow collection and does not close it on
  its line (its next lines could look like keys);
- for a key asked for: no value on its line, an anchor, alias, tag, block scalar or flow
  collection, another escape, a value k3s would trim or with a control character, or a value
  that goes on in the lines below;
- line breaks YAML knows and this reader does not (NEL, LS, PS, FF, VT).

Whatever settings() returns is what a YAML parser reads for the same text: tests/
test_plain_yaml.py holds it to PyYAML over generated documents.
"""

from __future__ import annotations

from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection

_BREAKS_UNREAD = ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_BLANK = " \t"
# A plain value may not start with these (YAML's indicators), nor with "-", "?" or ":" before
# a blank.
_INDICATORS = "[]{},&*!|>'\"%@`#"


class Unreadable(Exception):
    """The text may say something this reader cannot be sure of."""


class Setting(Record):
    key: str  # as written, a trailing "+" (k3s: append) included
    value: str
    line: int  # 1-based


def settings(text: str, wanted: Collection[str]) -> list[Setting]:
    """Each top-level key whose k3s_flag() is in wanted, with its string value, in the order
    they appear. Raises Unreadable."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if any(b in text for b in _BREAKS_UNREAD):
        raise Unreadable("line breaks other than LF and CR")
    found: list[Setting] = []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    began = False  # a key or "---" seen
    keyed = False  # a key seen
    continuing = False  # the last key asked for had its value: a line below may not go on
    listing = False  # the last key, not asked for, had none: a sequence may follow at column 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip(_BLANK)
        if not stripped or stripped.startswith("#"):
            continue
        if line[0] == "\t":
            raise Unreadable(f"line {number}: indented by a tab, which YAML does not allow")
        if listing and (line == "-" or line.startswith(("- ", "-\t"))):
            _skip_value(line[1:].strip(_BLANK), number)  # an item of that key's sequence
            continue
        if line[0] in _BLANK:
            if not keyed:
                raise Unreadable(f"line {number}: indented before any key")
            if continuing:
                raise Unreadable(f"line {number}: the value above goes on")
            continue  # below some other key
        continuing = listing = False
        if _marker(line, "---"):
            if began:
                break  # a second document: YAML parsers read the first only
            if line[3:].strip(_BLANK) and not line[3:].strip(_BLANK).startswith("#"):
                raise Unreadable(f"line {number}: content after ---")
            began = True
            continue
        if _marker(line, "..."):
            break
        began = keyed = True
        key, rest = _key(line, number)
        value_text = rest.strip(_BLANK)
        flag = k3s_flag(key)
        if flag in wanted:
            if key not in (flag, f"{flag}+"):
                raise Unreadable(f"line {number}: a key k3s trims or splits into {flag}")
            found.append(Setting(key, _value(value_text, number), number))
            continuing = True
        else:
            _skip_value(value_text, number)
            listing = not value_text or value_text.startswith("#")
    return found


def k3s_flag(key: str) -> str:
    """The flag a k3s config key sets. k3s trims the key (Go's strings.TrimSpace; str.strip()
    trims a few characters more, which only errs toward Unreadable), drops one trailing "+"
    (append to the value before), and passes `--key=value`, whose flag name ends at the first
    "="."""
    key = key.strip()
    return (key[:-1] if key.endswith("+") else key).split("=", 1)[0]


def _marker(line: str, marker: str) -> bool:
    return line.startswith(marker) and (len(line) == 3 or line[3] in _BLANK)


def _key(line: str, number: int) -> tuple[str, str]:
    """The key of a top-level line, unquoted, and the text after its colon."""
    first = line[0]
    if first in "\"'":
        key, end = _quoted(line, 0, number)
        rest = line[end:].lstrip(_BLANK)
        if not rest.startswith(":") or not (len(rest) == 1 or rest[1] in _BLANK):
            raise Unreadable(f"line {number}: a quoted key without a colon and a blank")
        return key, rest[1:]
    if first in _INDICATORS or (first in "-?:" and (len(line) == 1 or line[1] in _BLANK)):
        raise Unreadable(f"line {number}: not a plain key")
    at = 0
    while True:
        at = line.find(":", at)
        if at < 0:
            raise Unreadable(f"line {number}: not a key and a value")
        if at + 1 == len(line) or line[at + 1] in _BLANK:
            break
        at += 1
    key = line[:at].rstrip(_BLANK)
    if " #" in key or "\t#" in key:
        raise Unreadable(f"line {number}: not a key and a value")
    if key == "<<":
        raise Unreadable(f"line {number}: a merge key")
    return key, line[at + 1 :]


def _quoted(text: str, start: int, number: int, strict: bool = True) -> tuple[str, int]:
    """The string quoted at text[start] and the index after its closing quote. Not strict,
    any escape is skipped over (the string itself is then not what YAML reads)."""
    quote = text[start]
    out: list[str] = []
    at = start + 1
    while at < len(text):
        char = text[at]
        if quote == "'" and char == "'":
            if text[at + 1 : at + 2] == "'":
                out.append("'")
                at += 2
                continue
            return "".join(out), at + 1
        if quote == '"' and char == '"':
            return "".join(out), at + 1
        if quote == '"' and char == "\\":
            escaped = text[at + 1 : at + 2]
            if strict and escaped not in ('"', "\\"):
                raise Unreadable(f'line {number}: an escape other than \\\\ and \\"')
            out.append(escaped)
            at += 2
            continue
        out.append(char)
        at += 1
    raise Unreadable(f"line {number}: a quoted string that goes on below")


def _value(text: str, number: int) -> str:
    """A key's value written on its line: a string and at most a comment after it; nothing k3s
    would trim (it trims values as it trims keys), nor a control character, which go-yaml
    refuses."""
    value = _string(text, number)
    if value != value.strip() or not value.isprintable():
        raise Unreadable(f"line {number}: a value with blanks around it or a control character")
    return value


def _string(text: str, number: int) -> str:
    if not text or text.startswith("#"):
        raise Unreadable(f"line {number}: no value on the key's line")
    if text[0] in "\"'":
        value, end = _quoted(text, 0, number)
        after = text[end:]
        if after.strip(_BLANK) and not (after[0] in _BLANK and after.lstrip(_BLANK)[0] == "#"):
            raise Unreadable(f"line {number}: text after the quoted value")
        return value
    if text[0] in _INDICATORS or (text[0] in "-?:" and (len(text) == 1 or text[1] in _BLANK)):
        raise Unreadable(f"line {number}: not a plain string")
    if text[0] != "/":
        # true, 1e3, ~, 2001-12-14: YAML reads many plain words as no string; no path.
        raise Unreadable(f"line {number}: a plain value that is not a path")
    value = _before_comment(text)
    if ": " in value or ":\t" in value or value.endswith(":"):
        raise Unreadable(f"line {number}: a mapping inside a value")
    return value


def _before_comment(text: str) -> str:
    """A plain scalar's text: a "#" after a blank starts a comment."""
    for at in range(1, len(text)):
        if text[at] == "#" and text[at - 1] in _BLANK:
            return text[:at].rstrip(_BLANK)
    return text.rstrip(_BLANK)


def _skip_value(text: str, number: int) -> None:
    """Check that another key's value ends on its line or below it, indented."""
    if not text or text[0] not in "\"'[{":
        return  # plain, a block scalar's header, an anchor or a tag: what follows is indented
    depth = 0
    at = 0
    while at < len(text):
        char = text[at]
        if char in "\"'":
            _, at = _quoted(text, at, number, strict=False)
            if depth == 0:
                return
            continue
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return
        elif char == "#" and at > 0 and text[at - 1] in _BLANK:
            break
        at += 1
    raise Unreadable(f"line {number}: a flow collection that goes on below")
