"""plain_yaml reads k3s's and RKE2's config.yaml without a YAML library and says nothing a YAML
parser would not: over generated documents, every value it returns is PyYAML's reading of the
same key, every key asked for that PyYAML finds it found too, and where it cannot be sure it
raises Unreadable."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cni_reaper.runtime.plain_yaml import Unreadable, k3s_flag
from cni_reaper.runtime.plain_yaml import settings as read_settings

EXAMPLES = int(os.environ.get("CNI_REAPER_FUZZ_EXAMPLES", "300"))
WANTED = frozenset({"data-dir", "d"})


def first_document(text: str) -> Any:
    """What k3s's parser (go-yaml v2's Unmarshal) reads: the first document only."""
    for doc in yaml.safe_load_all(text):
        return doc
    return None


def agrees_with_pyyaml(text: str) -> bool:
    try:
        found = read_settings(text, WANTED)
    except Unreadable:
        return True
    doc = first_document(text)  # raises where PyYAML finds the text invalid
    if doc is None:
        doc = {}
    assert isinstance(doc, dict), doc
    # Every key k3s makes one of the flags of (trimmed, split at "="), as PyYAML reads it.
    theirs = {k: v for k, v in doc.items() if k3s_flag(str(k)) in WANTED}
    ours = {s.key: s.value for s in found}  # the last of a key given twice, as YAML's
    return ours == theirs


# --- generated documents: k3s's config lines, and what lies around and just beyond them -----

KEYS = st.sampled_from(
    [
        "data-dir", "d", "data-dir+", "d+", "data-dir++", '"data-dir"', "'d'", '"data\\x2ddir"',
        "token", "node-label", "tls-san", "write-kubeconfig-mode", "<<", "? data-dir",
        "&a data-dir", "!!str data-dir", "- data-dir", "data-dir ", "data#dir", "x #data-dir",
        '"data-dir "', "' d'", "data-dir\u00a0", "\u3000d", "data-dir=/x", "d=", "\tdata-dir",
    ]
)  # fmt: skip
VALUES = st.sampled_from(
    [
        "/opt/k3s", "/var/lib/rancher/k3s", "/a b", "/x#y", "/x #comment", "/x\t# c", "'/q'",
        '"/dq"', "'it''s/'", '"/e\\"q"', '"/tab\\t"', '"/sl\\/"', "&a /x", "*a", "|", ">-",
        "[/a, /b]", '["/a", "/b"]', "{k: /v}", "", "~", "null", "true", "1e3", "/x: y", "/x:",
        "'/open", '"/open', "[/open,", "- /x", "!!str /x", "relative/dir", "/trail   ",
        '"/x "', "'/x\t'", "/x\u00a0", '"/x\\/y"', "/a\tb", '"/nul\x00"',
    ]
)  # fmt: skip
FOLLOWERS = st.sampled_from(
    [
        "", "  - item", "  more", "  # comment", "# comment", "---", "--- # c", "...",
        "\t/tab-indented", "  data-dir: /inner", "/x]", "  /x'", "%YAML 1.1", "- item", "-",
        "- 'open", "-  data-dir: /in-list", "\tdata-dir: /tab",
    ]
)  # fmt: skip


@st.composite
def documents(draw: st.DrawFn) -> str:
    lines: list[str] = []
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(["---", "# k3s", "%YAML 1.1\n---", "  data-dir: /in"])))
    for _ in range(draw(st.integers(0, 5))):
        key, value = draw(KEYS), draw(VALUES)
        separator = draw(st.sampled_from([": ", ":", ":\t", " : ", ":  "]))
        lines.append(f"{key}{separator}{value}".rstrip() if value else f"{key}:")
        lines.extend(draw(st.lists(FOLLOWERS, max_size=2)))
    ending = draw(st.sampled_from(["\n", "\r\n", "", "\u2028"]))
    ended = draw(st.booleans())
    return ending.join(lines) + (ending if lines and ended else "")


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(documents())
@example("data-dir: /opt/k3s\n")
@example("base: &b\n  data-dir: /x\n<<: *b\n")
@example("data-dir: /x\n  /y\n")
def test_what_it_reads_is_what_a_yaml_parser_reads(text: str) -> None:
    try:
        first_document(text)
    except yaml.YAMLError:
        return  # k3s does not start with such a config: whatever the reaper reads is moot
    assert agrees_with_pyyaml(text), text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("# only a comment\n", []),
        ("data-dir: /opt/k3s\n", [("data-dir", "/opt/k3s")]),
        ("x: y\ndata-dir: '/srv/k3s' # moved\nd: /d\n", [("data-dir", "/srv/k3s"), ("d", "/d")]),
        ('---\n"data-dir": "/a/b"\n...\ndata-dir: /not-read\n', [("data-dir", "/a/b")]),
        ("tls-san:\n  - a.example\n  - b.example\ndata-dir+: /x\n", [("data-dir+", "/x")]),
        ("node-label: ['a=b', \"c=d\"]\ndata-dir: /x#y\n", [("data-dir", "/x#y")]),
    ],
)  # fmt: skip
def test_the_config_lines_k3s_users_write(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(s.key, s.value) for s in read_settings(text, WANTED)] == expected
    assert agrees_with_pyyaml(text)


@pytest.mark.parametrize(
    "text",
    [
        "{data-dir: /x}\n",
        "  data-dir: /x\n",
        "- data-dir: /x\n",
        "base: &b\n  data-dir: /x\n<<: *b\n",
        "data-dir: &a /x\n",
        "data-dir: |\n  /x\n",
        "data-dir:\n  /x\n",
        "data-dir: /x\n  /y\n",
        "data-dir: true\n",
        'data-dir: "/x\\u0041"\n',
        'token: "open\ndata-dir: /x"\n',
        "node-label: [a,\ndata-dir: /x]\n",
        "? data-dir\n: /x\n",
        "data-dir: /x\u2028",
        "%YAML 1.1\n---\ndata-dir: /x\n",
    ],
)
def test_what_could_hide_or_change_the_data_dir_is_unreadable(text: str) -> None:
    with pytest.raises(Unreadable):
        read_settings(text, WANTED)
