"""-v shows more of what a run kept; it never changes what the run did or its exit code."""

from __future__ import annotations

import pytest

from cni_reaper.errors import ExitCode
from cni_reaper.journal import EventLog
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS


def test_a_kept_reservation_shown_with_v_is_not_one_left_alone(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A whole entry (no runtime records: kept) and its reservation, kept for the runtime."""
    crashed.add(CONTAINER_IDS[0])
    crashed.reboot()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    (kept,) = report["host_local"]
    assert (kept["action"], kept["outcome"]) == ("keep", "skipped")
    assert report["summary"]["exit_code"] == 0
    assert crashed.run(capsys)[0] == ExitCode.OK  # the same without -v


def test_a_kept_reservation_shown_with_v_is_logged_as_kept(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.add(CONTAINER_IDS[1])
    crashed.reboot()
    logged: list[dict[str, str]] = []

    crashed.run(capsys, "-v", events=EventLog(lambda **fields: logged.append(fields)))

    (record,) = [f for f in logged if f.get("CNI_REAPER_ACTION") == "keep-reservation"]
    assert record["CNI_REAPER_EVENT"] == "kept"
