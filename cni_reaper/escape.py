r"""Text from outside, made safe to show: the one escaping every sink applies.

Plugin messages and stderr, file names, config strings and anything else the reaper did not
write itself reach a terminal (the text report, stderr), journald (every field, MESSAGE above
all) and the sd_notify STATUS line. Any of them may hold a newline that starts a forged
`cni-reaper: ... repaired` line, an escape sequence that rewrites the terminal, a carriage
return that overwrites what came before, a bidi override that shows the text reversed, or bytes
that are not UTF-8. So the sinks escape what they write, once, with printable(); the producers
need not, and a new field cannot forget it.

What is escaped: everything str.isprintable() rejects, that is C0 controls (\t, \n, \r
by name, the others as \x1b and the like), DEL (\x7f), C1 controls, format characters such as
U+202E and the zero-width ones, separators other than the ASCII space (U+2028 ends a line for
some readers), private-use and unassigned code points, and surrogates.

How: a code point is shown as \uXXXX or \UXXXXXXXX (U+0085 as \u0085, not \x85), an ASCII
control as \xNN; \xNN above 7f is kept for the one other thing: a byte of a file name that is
not UTF-8, which os.listdir hands over as a lone surrogate U+DC80..U+DCFF (surrogateescape). So
a file name's byte 0x85 and the code point U+0085 never look the same.

A backslash is not escaped. A plugin that prints the four characters `\x1b` looks the same as
one that printed a real ESC; that does not weaken the guarantee, which is that no control
character, and so no line break and no escape sequence, reaches a sink: a literal backslash can
forge nothing that the escaped form of a real control could not show already. Escaping it would
also make printable() not idempotent (its own output holds backslashes), and idempotence is what
lets a sink escape text that a producer may have escaped before. Texts without a backslash are
never confused with each other (tests/test_escaping.py checks that).
"""

from __future__ import annotations

from collections.abc import Sequence

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))


def is_printable(text: str) -> bool:
    """str.isprintable(), in a third of its time for ASCII text, which nearly all is: every
    record of a run is checked whole, and isprintable() looks each character up in the
    Unicode tables. isascii() is a flag of the string; bytes.translate() deletes the printable
    ASCII bytes through a 256-entry table, so anything left is a control character."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _PRINTABLE_ASCII)
    return text.isprintable()


def _escaped(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # the file name's byte that was not UTF-8
    if code < 0x80:
        return _NAMED.get(char) or f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """text as it may be shown: every character str.isprintable() rejects is escaped."""
    if is_printable(text):  # nearly always: the text returned as it is
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def printable_lines(lines: Sequence[str]) -> str:
    r"""Lines made of outside text, each escaped and ended with a newline: a newline inside one
    is shown as \n and can never start a line of its own."""
    if not lines:
        return ""
    if is_printable("".join(lines)):  # the common case: one check, no call per line
        return "\n".join(lines) + "\n"
    return "".join(printable(line) + "\n" for line in lines)
