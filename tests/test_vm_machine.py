"""The VM harness tells the scenario's own crash or hang from a guest that failed by itself."""

from __future__ import annotations

from tests.vm.machine import Boot, emulated_kernel_failure, emulated_stall

SYSRQ_CRASH = """\
[   41.204113] sysrq: Trigger a crash
[   41.204390] Kernel panic - not syncing: sysrq triggered crash
[   41.204811] CPU: 1 PID: 412 Comm: python3 Not tainted 6.1.0-28-cloud-amd64 #1
"""

OOPS_UNDER_EMULATION = """\
[    6.388432] RIP: 0010:sk_filter_trim_cap+0x39/0x260
[    6.388574] Kernel panic - not syncing: Fatal exception in interrupt
[    6.389084] Kernel Offset: 0x15c00000 from 0xffffffff81000000
"""


def test_the_scenarios_sysrq_crash_is_not_a_failure_of_the_guest() -> None:
    assert emulated_kernel_failure(SYSRQ_CRASH) is None


def test_a_kernel_that_died_by_itself_is_named_by_its_panic_line() -> None:
    assert emulated_kernel_failure(OOPS_UNDER_EMULATION) == (
        "Kernel panic - not syncing: Fatal exception in interrupt"
    )


def test_a_boot_that_powered_off_is_not_a_failure() -> None:
    assert emulated_kernel_failure("[   12.0] reboot: Power down\n") is None


KERNEL_STALLED = """\
[    0.982939] NET: Registered PF_INET protocol family
[    0.985377] IP idents hash table entries: 32768 (order: 6, 262144 bytes, linear)
"""

USER_SPACE_HUNG = """\
[    2.411020] Run /init as init process
[   19.204113] cni-reaper[412]: planned DEL of 3 attachments
"""


def test_a_guest_killed_before_user_space_is_an_emulation_stall_to_boot_again() -> None:
    stall = emulated_stall(Boot(KERNEL_STALLED, 480.0, killed=True))
    assert stall is not None and "IP idents hash table" in stall


def test_a_guest_killed_once_its_user_space_ran_is_the_scenarios_failure() -> None:
    assert emulated_stall(Boot(USER_SPACE_HUNG, 480.0, killed=True)) is None
    assert emulated_stall(Boot(KERNEL_STALLED, 3.0, killed=False)) is None
