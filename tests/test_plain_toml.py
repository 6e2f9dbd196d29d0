"""plain_toml reads the configs runtimes write without tomllib, and says nothing tomllib
would not: over generated documents, whatever it returns is tomllib's own reading, type for
type; on the configs containerd writes it reads them all; on anything else it declines, and
tomllib reads the file (its errors included)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_reaper.runtime import config, plain_toml
from tests.private_node import cannot_run

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("CNI_REAPER_FUZZ_EXAMPLES", "300"))
CONFIGS = [
    REPO / "tests/vm/guest/containerd.toml",
    REPO / "tests/vm/guest/containerd-campaign.toml",
]


def same(a: object, b: object) -> bool:
    """Equal and of the same types throughout: True is not 1, 0.0 is not -0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


def agrees_with_tomllib(text: str) -> bool:
    """plain_toml's reading of text is tomllib's, or plain_toml declined to read it."""
    found = plain_toml.loads(text)
    if found is None:
        return True
    return same(found, tomllib.loads(text))  # raises if tomllib finds the text invalid


# --- generated documents: the plain part of TOML, and what lies just outside it ------------

KEYS = st.one_of(
    st.from_regex(r"[A-Za-z0-9_-]{1,6}", fullmatch=True),
    st.sampled_from(['"a.b"', "'x y'", '""', '"io.containerd.grpc.v1.cri"', "true", "1", "a"]),
)
SCALARS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(
        [
            "true",
            "false",
            "+1",
            "-0",
            "-0.0",
            "1e5",
            "1E-2",
            "0.02",
            "1.",
            ".5",
            "01",
            "1_000",
            "0x1f",
            "inf",
            "nan",
            "1979-05-27",
            "07:32:00",
            '"a\\tb"',
            "'c:\\x'",
            '"""m"""',
            "{}",
            "{ a = 1 }",
            "tru",
            "falsey",
            '"open',
            "'it''s'",
        ]
    ),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=8).map(json.dumps),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="'"), max_size=8).map(
        lambda s: f"'{s}'"
    ),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.tuples(
        st.lists(inner, max_size=4),
        st.sampled_from([", ", ",", ",\n  ", " , # c\n"]),
        st.booleans(),
    ).map(lambda t: "[" + t[1].join(t[0]) + ("," if t[2] and t[0] else "") + "]"),
    max_leaves=8,
)
SPACE = st.sampled_from(["", " ", "\t", "  "])
LINES = st.one_of(
    st.tuples(KEYS, SPACE, SPACE, VALUES, st.sampled_from(["", " # note", "#", " x"])).map(
        lambda t: f"{t[0]}{t[1]}={t[2]}{t[3]}{t[4]}"
    ),
    st.tuples(st.lists(KEYS, min_size=1, max_size=3), SPACE, st.booleans()).map(
        lambda t: ("[[" if t[2] else "[") + t[1] + ".".join(t[0]) + ("]]" if t[2] else "]")
    ),
    st.sampled_from(["", "# comment", "   ", "a.b = 1", "= 1", "\r", "a = 1\r", "\x7f", "[a"]),
)
DOCUMENTS = st.lists(LINES, max_size=12).map("\n".join)


@settings(max_examples=EXAMPLES, deadline=None)
@given(DOCUMENTS)
def test_what_it_reads_of_a_generated_document_is_what_tomllib_reads(text: str) -> None:
    assert agrees_with_tomllib(text)


@settings(max_examples=EXAMPLES, deadline=None)
@given(DOCUMENTS, st.integers(0, 400), st.text(" \t\n\"'[]{}=.,#\\0123456789aeftx+-_", max_size=3))
def test_a_document_cut_or_spliced_anywhere_is_read_as_tomllib_reads_it_or_not_at_all(
    text: str, at: int, splice: str
) -> None:
    at = min(at, len(text))
    assert agrees_with_tomllib(text[:at])
    assert agrees_with_tomllib(text[:at] + splice + text[at:])


def test_the_plain_part_of_toml_and_what_it_leaves_to_tomllib() -> None:
    read = {
        'root = "/var/lib/containerd"\nversion = 2\n': {
            "root": "/var/lib/containerd",
            "version": 2,
        },
        '[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/opt/cni/bin"  # ours\n': {
            "plugins": {"io.containerd.grpc.v1.cri": {"cni": {"bin_dir": "/opt/cni/bin"}}}
        },
        "pause_threshold = 0.02\nenabled = false\n": {"pause_threshold": 0.02, "enabled": False},
        "hooks_dir = [\n  '/usr/share/containers/oci/hooks.d',  # one\n]\n": {
            "hooks_dir": ["/usr/share/containers/oci/hooks.d"]
        },
        "[a]\n[a.b]\nx = 1\n": {"a": {"b": {"x": 1}}},
    }
    for text, doc in read.items():
        assert same(plain_toml.loads(text), doc), text
        assert same(tomllib.loads(text), doc), text
    # Valid TOML outside the plain part: tomllib reads each of these.
    for text in [
        'a = "tab\\there"',
        'a = """two\nlines"""',
        "a = { b = 1 }",
        "a.b = 1",
        "d = 1979-05-27",
        "n = 1_000",
        "[[runtimes]]\nname = 'runc'",
        "[a.b]\n[a]\n",
        "a = 1\r\n",
    ]:
        assert plain_toml.loads(text) is None, text
        tomllib.loads(text)
    # Invalid TOML: declined too, so that tomllib's error names what is wrong.
    for text in ["a = 1\na = 2", "[a]\n[a]", "a = 1\n[a]", "a = ", "a = [1,,]", "[a", "a = 01"]:
        assert plain_toml.loads(text) is None, text
        with pytest.raises(ValueError):
            tomllib.loads(text)


def containerd_default_config() -> str:
    if shutil.which("containerd") is None:
        cannot_run("Debian's containerd is not installed: its default config is the seed")
    done = subprocess.run(
        ["containerd", "config", "default"], capture_output=True, text=True, check=True
    )
    return done.stdout


def test_the_configs_containerd_writes_are_read_without_tomllib() -> None:
    for text in [containerd_default_config(), *(p.read_text() for p in CONFIGS)]:
        found = plain_toml.loads(text)
        assert found is not None
        assert same(found, tomllib.loads(text))


def test_a_run_on_a_node_with_containerds_default_config_never_imports_tomllib(
    tmp_path: Path,
) -> None:
    """The start-up cost this is for: containerd's config read, tomllib (and typing, which it
    imports) never loaded."""
    etc = tmp_path / "etc/containerd"
    etc.mkdir(parents=True)
    (etc / "config.toml").write_text(containerd_default_config())
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from cni_reaper.runtime import config\n"
        f"configs = config.load({str(tmp_path)!r})\n"
        "print(json.dumps([configs.warnings, [m for m in ('tomllib', 'tomli', 'typing') "
        "if m in sys.modules]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == [[], []]
    # The same config through tomllib reads the same.
    assert config.load(str(tmp_path)).warnings == ()
