"""Outside text reaches no sink raw: a plugin's msg, details and stderr, file names, network
names, plugin types and conf file names are escaped in the text report, the JSON report, the
lines on stderr, every journal field, the STATUS line, the metrics file and main()'s error line.

The hostile text carries what can forge or hide: an escape sequence that clears the screen, a
newline followed by a forged `cni-reaper: ... repaired` line, a carriage return, a bidi override
and a C1 control (CSI, which a terminal takes as ESC [); file names add bytes that are not UTF-8.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from cni_reaper import cli
from cni_reaper.escape import is_printable, printable, printable_lines
from cni_reaper.journal import EventLog
from tests.crashed import Crashed
from tests.journald_scenario import reaper_in_journald
from tests.nodetree import CONTAINER_IDS
from tests.notify_socket import status_lines
from tests.private_node import cannot_run
from tests.test_journal import _why_no_journald

FORGED = "cni-reaper: hl-x-eth0: empty, previous-boot -> del-and-quarantine [done]: repaired"
HOSTILE = f"\x1b[2J\n{FORGED}\rhidden \u202eesrever\x9b2J"
SHOWN = r"\x1b[2J\n" + FORGED + r"\rhidden \u202eesrever\u009b2J"  # printable(HOSTILE)
# A file name's byte that is not UTF-8 comes from listdir as a lone surrogate.
NOT_UTF8 = os.fsdecode(b"\xff")
# In a config, Go decodes that surrogate's escape (and any byte that is not UTF-8) to U+FFFD,
# and libcni names the network and runs the plugin so: the names as libcni has them.
AS_GO_DECODES = "\ufffd"
NETWORK = f"net\n\x1b[2J{AS_GO_DECODES}"
KIND = f"plug\n\x1b[31m\u202e{AS_GO_DECODES}"  # the plugin's type, and its executable's name
IFNAME = "e\x1b]0;owned\x07th0"  # OSC: would set the terminal's title
QUIET_NETWORK = "quiet\x1b[2J"  # its plugin says nothing but on stderr
CID = CONTAINER_IDS[9]


def raw_controls(text: str) -> list[str]:
    """What no sink may receive: C0 controls but the newline that ends a line, DEL, C1
    controls, the bidi override U+202E, and surrogates (bytes that were not UTF-8)."""
    return [
        char
        for char in text
        if (ord(char) < 0x20 and char != "\n")
        or 0x7F <= ord(char) <= 0x9F
        or char == "\u202e"
        or 0xD800 <= ord(char) <= 0xDFFF
    ]


def assert_safe_lines(text: str) -> list[str]:
    """Every line of text printable, with no raw control; the lines, without their newline."""
    assert raw_controls(text) == []
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    assert all(line.isprintable() for line in lines)
    return lines


# --- printable() itself ---------------------------------------------------------------------

# Every code point, surrogates too: file names bring them.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=60)
NO_BACKSLASH = st.text(st.characters(exclude_categories=(), exclude_characters="\\"), max_size=60)
# Texts that could be confused if the escapes were chosen badly: the byte 0x85 of a file name
# and the code point U+0085, ESC and the characters of its escape, a tab and "\t".
NEAR_MISSES = st.text(
    st.sampled_from(["\x85", "\udc85", "\x1b", "x", "1", "b", "u", "0", "8", "5", "\t", "t"]),
    max_size=8,
)


def shown_back(shown: str) -> str:
    """The text printable() was given, from what it returned, for text without a backslash:
    proof that no two such texts are shown the same."""
    named = {"t": "\t", "n": "\n", "r": "\r"}
    widths = {"x": 2, "u": 4, "U": 8}
    text = []
    at = 0
    while at < len(shown):
        char = shown[at]
        if char != "\\":
            text.append(char)
            at += 1
            continue
        kind = shown[at + 1]
        if kind in named:
            text.append(named[kind])
            at += 2
            continue
        width = widths[kind]
        code = int(shown[at + 2 : at + 2 + width], 16)
        if kind == "x" and code >= 0x80:
            code += 0xDC00  # a byte that was not UTF-8, as listdir hands it over
        text.append(chr(code))
        at += 2 + width
    return "".join(text)


@settings(max_examples=500)
@given(ANY_TEXT)
def test_printable_output_is_printable_and_idempotent(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable()
    assert raw_controls(shown) == []
    assert printable(shown) == shown


@settings(max_examples=500)
@given(ANY_TEXT)
def test_the_fast_check_is_str_isprintable(text: str) -> None:
    assert is_printable(text) == text.isprintable()


@settings(max_examples=500)
@given(NO_BACKSLASH)
def test_text_without_a_backslash_can_be_read_back_from_how_it_is_shown(text: str) -> None:
    assert shown_back(printable(text)) == text


@settings(max_examples=500)
@given(NEAR_MISSES, NEAR_MISSES)
def test_distinct_texts_without_a_backslash_are_shown_distinct(one: str, other: str) -> None:
    if one != other:
        assert printable(one) != printable(other)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("eth0", "eth0"),
        ("\x1b[2J", r"\x1b[2J"),
        ("a\nb\rc\td", r"a\nb\rc\td"),
        ("\x00\x7f", r"\x00\x7f"),
        ("\x85", r"\u0085"),  # the code point NEL
        (os.fsdecode(b"\x85"), r"\x85"),  # the byte 0x85 of a file name that is not UTF-8
        ("\u202e\u200b\u2028", r"\u202e\u200b\u2028"),
        ("\U000e0041", r"\U000e0041"),  # a tag character: invisible
        ("caf\u00e9 \u0416", "caf\u00e9 \u0416"),  # letters are letters
        (r"typed \x1b", r"typed \x1b"),  # a backslash is left as it is
        (HOSTILE, SHOWN),
    ],
)
def test_what_is_escaped_and_how(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_lines_stay_lines_and_a_newline_inside_one_does_not_start_another() -> None:
    assert printable_lines([]) == ""
    assert printable_lines(["a", "b"]) == "a\nb\n"
    assert printable_lines(["a", HOSTILE]) == f"a\n{SHOWN}\n"


# --- the sinks, fed directly ----------------------------------------------------------------


class Recorder:
    """Stands where systemd.journal.send stands, and keeps what would have been sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []

    def __call__(self, **fields: str) -> None:
        self.sent.append(fields)


def hostile_record(**extra: str) -> dict[str, str]:
    return {
        "MESSAGE": HOSTILE,
        "PRIORITY": "5",
        "SYSLOG_IDENTIFIER": "cni-reaper",
        "CNI_NETWORK": NETWORK,
        **extra,
    }


def test_every_field_is_escaped_even_one_that_no_builder_knows() -> None:
    """The escaping is the sink's, so a field added tomorrow cannot forget it."""
    record = hostile_record(CNI_REAPER_SOMETHING_NEW=HOSTILE)
    recorder = Recorder()
    EventLog(send=recorder).emit(record)
    assert recorder.sent == [{key: printable(value) for key, value in record.items()}]

    stream = io.StringIO()
    EventLog(stream=stream).emit(record)
    (line,) = assert_safe_lines(stream.getvalue())
    assert line.startswith(f"cni-reaper: {SHOWN} (")
    assert f"cni_reaper_something_new={SHOWN}" in line


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(["CNI_A", "CNI_B", "PRIORITY"]), ANY_TEXT), ANY_TEXT)
def test_a_record_is_one_printable_line_whatever_its_values(
    fields: dict[str, str], message: str
) -> None:
    stream = io.StringIO()
    log = EventLog(stream=stream, block=8)
    log.emit({"MESSAGE": message, **fields})
    log.flush()
    assert len(assert_safe_lines(stream.getvalue())) == 1


# --- a run on a node full of hostile text ---------------------------------------------------


def plugin_script(stdout: bytes, stderr: bytes) -> str:
    """A shell plugin that prints these bytes and fails; printf's octal escapes carry them."""

    def octal(data: bytes) -> str:
        return "".join(f"\\{byte:03o}" for byte in data)

    return f"#!/bin/sh\nprintf '{octal(stdout)}'\nprintf '{octal(stderr)}' >&2\nexit 1\n"


def hostile_node(crashed: Crashed) -> list[str]:
    """Networks, plugins, conf files, results files and a reservation, all named with hostile
    text, and plugins that fail with it; returns the reaper's extra arguments."""
    root = crashed.node.root
    bin_dir = root / "opt/cni/bin"
    bin_dir.mkdir(parents=True)
    error = {"cniVersion": "1.0.0", "code": 11, "msg": HOSTILE, "details": HOSTILE}
    loud, quiet = bin_dir / KIND, bin_dir / "quiet"
    loud.write_text(plugin_script(json.dumps(error).encode(), HOSTILE.encode()))
    quiet.write_text(plugin_script(b"", HOSTILE.encode()))
    for plugin in (loud, quiet):
        plugin.chmod(0o755)
    conf = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{"type": KIND, "ipam": {"type": "host-local"}}],
    }
    crashed.node.write_conf(f"60-{NETWORK}.conflist", json.dumps(conf).encode())
    quiet_conf = {"cniVersion": "1.0.0", "name": QUIET_NETWORK, "plugins": [{"type": "quiet"}]}
    crashed.node.write_conf(f"61-{QUIET_NETWORK}.conflist", json.dumps(quiet_conf).encode())
    crashed.node.write_conf(f"55-{HOSTILE}.conflist", b"{not json")
    crashed.node.write_result(f"{NETWORK}-{CID}-{IFNAME}", b"")
    # A file name that is not UTF-8, of a network no config names.
    crashed.node.write_result(f"gone{NOT_UTF8}-{CONTAINER_IDS[11]}-eth0", b"")
    crashed.node.write_result(f"{QUIET_NETWORK}-{CONTAINER_IDS[10]}-eth0", b"\0" * 40)
    # The cache dir named on the command line is a config string too.
    cache_dir = root / f"var/lib/cni{HOSTILE}"
    (root / "var/lib/cni").rename(cache_dir)
    store = root / "var/lib/cni/networks" / NETWORK  # host-local's, under the root
    store.mkdir(parents=True)
    (store / "10.99.0.7").write_bytes(b"")  # a reservation with no owner to release it
    return ["--bin-dir", str(bin_dir), "--cache-dir", str(cache_dir)]


@pytest.fixture
def hostile(crashed: Crashed) -> list[str]:
    argv = hostile_node(crashed)
    crashed.reboot()
    return argv


def run(crashed: Crashed, argv: list[str], events: EventLog, environ: Mapping[str, str]) -> int:
    return int(
        cli.run(crashed.argv(*argv), clock=lambda: crashed.t0 + 60, events=events, environ=environ)
    )


def test_the_text_report_stderr_lines_and_status_show_hostile_text_escaped(
    crashed: Crashed, hostile: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    stream = io.StringIO()
    address = tmp_path / "notify"
    with status_lines(address) as sent:
        code = run(crashed, hostile, EventLog(stream=stream), {"NOTIFY_SOCKET": str(address)})

    assert code == 73  # both plugins failed; their files are quarantined all the same
    out = capsys.readouterr().out
    report = assert_safe_lines(out)
    conf_path = crashed.node.conf_dir / f"60-{NETWORK}.conflist"
    # The chain the DEL runs: the plugin, then the IPAM plugin it execs; then what ran.
    chain = f"    DEL {printable(NETWORK)} from {printable(str(conf_path))}: {printable(KIND)}, "
    assert f"{chain}host-local (ran: {printable(KIND)})" in report
    assert f"{printable(NETWORK)}-{CID}-{printable(IFNAME)}: empty (0 bytes), " in out
    assert SHOWN in out  # the plugin's msg and details, as it sent them, escaped
    assert r"\x1b[2J\ncni-reaper: hl-x" in out  # the forged line, inside the line it was in
    assert f"  warning: config skipped: {printable(str(crashed.node.conf_dir))}/55-{SHOWN}" in out
    reservation = printable(str(crashed.node.root / "var/lib/cni/networks" / NETWORK / "10.99.0.7"))
    assert (
        f"{reservation}: host-local reservation empty, previous-boot -> quarantine [done]" in report
    )
    assert not any(line.startswith(FORGED[:20]) for line in report)

    lines = assert_safe_lines(stream.getvalue())
    assert all(line.startswith("cni-reaper: ") and line.endswith(")") for line in lines)
    assert not any(line.startswith(FORGED[:20]) for line in lines)
    assert any(f"cni_network={printable(NETWORK)}" in line and SHOWN in line for line in lines)
    assert any(r"netplugin failed: '\x1b[2J\ncni-reaper: hl-x" in line for line in lines)
    assert any(line.startswith(f"cni-reaper: {reservation}: host-local") for line in lines)

    assert sent and all(raw_controls(status) == [] and status.isprintable() for status in sent)
    assert (
        sent[0] == f"STATUS=scanning {printable(str(crashed.node.root))}/var/lib/cni{SHOWN}/results"
    )


def test_the_json_report_is_plain_lines_and_keeps_the_original_text(
    crashed: Crashed, hostile: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prom = tmp_path / "cni-reaper.prom"
    code = run(
        crashed,
        [*hostile, "--json", "--metrics-file", str(prom)],
        EventLog(stream=io.StringIO()),
        {},
    )

    assert code == 73
    out = capsys.readouterr().out
    assert_safe_lines(out)
    report = json.loads(out)
    entry = next(e for e in report["entries"] if e["network"] == NETWORK)
    assert entry["ifname"] == IFNAME
    assert entry["del"]["plugins"] == [KIND]
    assert (entry["plugin_errors"][0]["msg"], entry["plugin_errors"][0]["details"]) == (
        HOSTILE,
        HOSTILE,
    )
    # The plugin type is a label value that reads as it is shown; the DEL of the entry of a
    # network no config names fails before any plugin ("none").
    failures = {
        sample.labels["plugin"]: sample.value
        for family in text_string_to_metric_families(prom.read_text(encoding="utf-8"))
        for sample in family.samples
        if sample.name == "cni_reaper_del_failures"
    }
    assert failures == {printable(KIND): 1, "quiet": 1, "none": 1}


def test_every_journal_field_of_a_run_is_escaped(
    crashed: Crashed, hostile: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = Recorder()
    run(crashed, hostile, EventLog(send=recorder), {})

    assert capsys.readouterr().out == ""
    for record in recorder.sent:
        for value in record.values():
            assert raw_controls(value) == [] and value.isprintable(), (record, value)
    entry = next(r for r in recorder.sent if r.get("CNI_IFNAME") == printable(IFNAME))
    assert entry["CNI_NETWORK"] == printable(NETWORK)
    assert entry["CNI_REAPER_FILE"] == f"{printable(NETWORK)}-{CID}-{printable(IFNAME)}"
    assert entry["MESSAGE"].startswith(f"{entry['CNI_REAPER_FILE']}: empty")
    assert SHOWN in entry["CNI_REAPER_PLUGIN_ERRORS"]
    reservation = next(r for r in recorder.sent if "host-local" in r.get("MESSAGE", ""))
    assert reservation["CNI_REAPER_FILE"] == printable(
        str(crashed.node.root / "var/lib/cni/networks" / NETWORK / "10.99.0.7")
    )


def test_an_error_line_of_main_is_one_escaped_line(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cache_dir = tmp_path / f"cache{HOSTILE}"
    cache_dir.mkdir()
    (cache_dir / "results").symlink_to(tmp_path)  # refused: never followed
    crashed.reboot()

    code = cli.main([*crashed.argv("--dry-run"), "--cache-dir", str(cache_dir)], environ={})

    assert code == 65
    (line,) = assert_safe_lines(capsys.readouterr().err)
    assert line.startswith(
        f"cni-reaper: {printable(str(tmp_path))}/cache{SHOWN}/results is a symlink"
    )


def test_hostile_text_arrives_in_a_real_journald_as_printable_text(
    crashed: Crashed, tmp_path: Path
) -> None:
    reason = _why_no_journald()
    if reason:
        cannot_run(reason)
    extra = hostile_node(crashed)
    time.sleep(3.2)  # the reaper runs on the real clock: the reboot comes after the files
    crashed.reboot_now()
    result = reaper_in_journald(crashed.node.root, tmp_path / "journal.json", *extra)
    assert result["exit"] == 73
    records = result["records"]
    assert any(r.get("CNI_REAPER_EVENT") == "summary" for r in records)
    for record in records:
        # The fields the reaper sent; journald's own (_CMDLINE holds the hostile argv) are not.
        for key, value in record.items():
            if not key.startswith("_"):
                # journalctl shows a value that is not printable UTF-8 as a list of bytes.
                assert isinstance(value, str), (key, value)
                assert raw_controls(value) == [] and value.isprintable(), (key, value)
    entry = next(r for r in records if r.get("CNI_IFNAME") == printable(IFNAME))
    assert entry["CNI_NETWORK"] == printable(NETWORK)
    assert entry["_TRANSPORT"] == "journal"
    assert SHOWN in entry["MESSAGE"] + entry["CNI_REAPER_PLUGIN_ERRORS"]
