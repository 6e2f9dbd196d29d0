"""The plain part of TOML that runtimes' configs are written in, read without tomllib.

tomllib (tomli below 3.11) imports typing, datetime and string and compiles its regexes at
import: some 10 ms of every run on a node whose runtime has a config, a third as much again as
the reaper's own imports. The configs `containerd config default` writes, and those k3s, RKE2
and CRI-O ship, use little of TOML: table headers, `key = value` lines, basic strings without
escapes, literal strings, decimal integers and floats, booleans, and arrays of those over one
or more lines, with comments. loads() reads that and nothing else: for any other text (an
escape, a multi-line string, an inline table, a date, a dotted key, a table header met before,
a key given twice, anything invalid) it returns None, and tomllib reads the file and decides,
its errors included. Whatever loads() returns is what tomllib returns for the same text:
tests/test_plain_toml.py holds the two to each other over generated documents and on the
configs containerd writes.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Anything loads() does not read: CR (a lone one is invalid, CRLF is rare on a node), and the
# control characters TOML allows nowhere (tab and newline are the only ones it allows).
_UNREAD_CHARACTERS = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# A decimal integer, or a float with a fraction, an exponent or both. Underscores, leading
# zeros, hex, octal, binary, inf and nan stop the match where the next character is read and
# refused; so do the digits of a date or a time.
_NUMBER = re.compile(r"[+-]?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_WHITESPACE = " \t"
_MAX_ARRAY_DEPTH = 8
_MAX_INTEGER_CHARS = len(str(-(2**63)))


class _NotPlain(Exception):
    """The text is not in the part of TOML loads() reads."""


def loads(text: str) -> dict[str, Any] | None:
    """The document, as tomllib.loads(text) returns it; None if text is not plain TOML."""
    if _UNREAD_CHARACTERS.search(text):
        return None
    try:
        return _Reader(text).document()
    except _NotPlain:
        return None


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def document(self) -> dict[str, Any]:
        root: dict[str, Any] = {}
        table = root
        # Every table a header made, or went through, by identity: a set of the paths to them
        # held every prefix of a header's path, n * n / 2 slots for a header of n parts.
        headers: set[int] = set()
        text = self.text
        while True:
            self.skip_whitespace()
            if self.at >= len(text):
                return root
            char = text[self.at]
            if char == "\n":
                self.at += 1
            elif char == "#":
                self.skip_comment()
            elif char == "[":
                table = self.header(root, headers)
                self.end_of_line()
            else:
                key = self.key()
                self.skip_whitespace()
                if not text.startswith("=", self.at):
                    raise _NotPlain  # a dotted key, or no key-value pair at all
                self.at += 1
                self.skip_whitespace()
                value = self.value(0)
                if key in table:
                    raise _NotPlain
                table[key] = value
                self.end_of_line()

    def header(self, root: dict[str, Any], headers: set[int]) -> dict[str, Any]:
        self.at += 1
        if self.text.startswith("[", self.at):
            raise _NotPlain  # an array of tables
        path: list[str] = []
        while True:
            self.skip_whitespace()
            path.append(self.key())
            self.skip_whitespace()
            if self.text.startswith(".", self.at):
                self.at += 1
            elif self.text.startswith("]", self.at):
                self.at += 1
                break
            else:
                raise _NotPlain
        table = root
        for depth, key in enumerate(path):
            last = depth == len(path) - 1
            if key not in table:
                table[key] = {}
            elif last or type(table[key]) is not dict or id(table[key]) not in headers:
                # Defined again, or a key-value pair's name: TOML's rules on which of those
                # are allowed are left to tomllib.
                raise _NotPlain
            table = table[key]
            headers.add(id(table))  # every table stays in the document: its id stays its own
        return table

    def key(self) -> str:
        text, at = self.text, self.at
        if text.startswith(('"', "'"), at):
            return self.string()
        found = _BARE_KEY.match(text, at)
        if found is None:
            raise _NotPlain
        self.at = found.end()
        return found.group()

    def value(self, depth: int) -> Any:
        text, at = self.text, self.at
        if at >= len(text):
            raise _NotPlain
        char = text[at]
        if char in "\"'":
            return self.string()
        if char == "[":
            return self.array(depth + 1)
        for word, meaning in (("true", True), ("false", False)):
            if text.startswith(word, at):
                self.at = at + len(word)
                return meaning
        found = _NUMBER.match(text, at)
        if found is None:
            raise _NotPlain  # an inline table, inf, nan, anything else
        self.at = found.end()
        fraction, exponent = found.groups()
        if fraction is None and exponent is None:
            if len(found.group()) > _MAX_INTEGER_CHARS:
                raise _NotPlain  # past TOML's 64 bits (and, at 4,300 digits, Python's int())
            return int(found.group())
        return float(found.group())

    def string(self) -> str:
        """A basic string without escapes, or a literal string, on one line."""
        text, at = self.text, self.at
        quote = text[at]
        if text.startswith(quote * 3, at):
            raise _NotPlain  # multi-line
        end = text.find(quote, at + 1)
        if end < 0:
            raise _NotPlain
        body = text[at + 1 : end]
        if "\n" in body or (quote == '"' and "\\" in body):
            raise _NotPlain
        self.at = end + 1
        return body

    def array(self, depth: int) -> list[Any]:
        if depth > _MAX_ARRAY_DEPTH:
            raise _NotPlain
        self.at += 1
        items: list[Any] = []
        while True:
            self.skip_blank()
            if self.text.startswith("]", self.at):
                self.at += 1
                return items
            items.append(self.value(depth))
            self.skip_blank()
            if self.text.startswith(",", self.at):
                self.at += 1
            elif self.text.startswith("]", self.at):
                self.at += 1
                return items
            else:
                raise _NotPlain

    def end_of_line(self) -> None:
        """Only whitespace and a comment may follow a header or a key-value pair."""
        self.skip_whitespace()
        if self.text.startswith("#", self.at):
            self.skip_comment()
        if self.at < len(self.text):
            if self.text[self.at] != "\n":
                raise _NotPlain
            self.at += 1

    def skip_whitespace(self) -> None:
        text, at = self.text, self.at
        while at < len(text) and text[at] in _WHITESPACE:
            at += 1
        self.at = at

    def skip_comment(self) -> None:
        end = self.text.find("\n", self.at)
        self.at = len(self.text) if end < 0 else end

    def skip_blank(self) -> None:
        """Inside an array: whitespace, newlines and comments."""
        text = self.text
        while self.at < len(text):
            char = text[self.at]
            if char in " \t\n":
                self.at += 1
            elif char == "#":
                self.skip_comment()
            else:
                return
