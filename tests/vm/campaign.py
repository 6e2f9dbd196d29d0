"""A crash campaign (issue 18): real kernel crashes at seeded instants during pod churn, each
followed by the next boot under several boot policies, and the invariants an operator cares
about checked after a kubelet-like teardown.

For crash i of a campaign with seed S, the node boots its image in mode `churn` with
vmtest.seed=S+i: both networks (bridge + host-local + portmap, ptp + host-local), two workers
running, stopping and removing pods through CRI, and the kernel crashed (sysrq c, no sync) a
seeded delay after the seeded n-th CNI call (RunPodSandbox or StopPodSandbox) started, or at
most 50 ms after the seeded n-th file event (inotify) in the results dir or a host-local store,
inside or just past libcni's and host-local's writes (the seed picks which). The
crashed disk is then booted once per policy, each boot on its own branch of that one disk state:

  reaper      cni-reaper's unit as shipped
  none        no repair at all (cni-reaper.disable on the kernel command line)
  rm-results  the results dir deleted before the runtime starts, as the EKS AMI's
              cni-cache-reset.service does (Bottlerocket: tmpfiles R! /var/lib/cni/results)

Each policy boot reports what it found, starts a pod of its own (as kubelet starts new pods
while it cleans up), then stops and removes every sandbox of the crashed boot, then the new pod
too (tests/vm/guest/driver.py, mode campaign-check). Per policy: sandboxes stuck (a Stop or
Remove that failed twice), addresses leaked (host-local reservations left in either store once
no sandbox runs), results files left, quarantined files the reaper's journal records do not
account for, whether the new pod lost any part of its network (its reservations, results
files, addresses in its netns, portmap's rules) while the crashed boot's sandboxes were torn
down, and how long the policy's unit held containerd back (systemd's timestamps).

usage: python3 -m tests.vm.campaign --suite bookworm --crashes N --seed S \\
           --policies reaper,none,rm-results --work DIR

Exits 1 when the reaper policy broke an invariant after any crash; DIR/campaign.json holds every
crash run in DIR, by seed (seed, planned instant, what the churn did, per-policy outcome), and
DIR/crash-<seed>/ the serial logs of its boots. A crash is run again by its seed alone
(--seed S --crashes 1): the same plan, on a churn whose timing under emulation varies a little.
A crash the reaper broke an invariant after also keeps its crashed disk's node state as
DIR/crash-<seed>/state.tar.xz (tests/vm/crash_state.py): copied to tests/crash_states/ it is
replayed exactly by tests/test_crash_states.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.vm import crash_state
from tests.vm.machine import Boot, Image, Node, have_tools

REPO = Path(__file__).resolve().parents[2]
NETWORKS = ("podnet", "ptpnet")
DEBS = {"bookworm": "vm-debs.tgz", "trixie": "vm-debs-trixie.tgz"}
# What each policy adds to the kernel command line. The EKS-like unit runs only when asked
# (vmtest-rm-results.service); neither it nor "none" runs the reaper.
POLICIES = {
    "reaper": "vmtest.policy=reaper",
    "none": "vmtest.policy=none cni-reaper.disable",
    "rm-results": "vmtest.policy=rm-results cni-reaper.disable",
}
HOLDING_UNIT = {"reaper": "cni-reaper.service", "rm-results": "vmtest-rm-results.service"}
QUARANTINE = "/var/lib/cni-reaper/quarantine/"
# When the crash is planned after a CNI call (not after a file event), its delay after the
# call's start is drawn from [0, this) seconds: under TCG a RunPodSandbox of two networks takes
# about 7 to 12 s, a StopPodSandbox about 5, so the crash lands anywhere in or after the call.
CRASH_WINDOW = 8.0
# What goes into the image: when none of it changed, an image already built is used again.
IMAGE_INPUTS = (
    "cni_reaper",
    "systemd",
    "packaging",
    "pyproject.toml",
    "tests/vm/build_image.sh",
    "tests/vm/guest",
    "tests/cri.py",
    "tests/pause_image.py",
    "bench/run.py",
)


def inputs_digest() -> str:
    digest = hashlib.sha256()
    for name in IMAGE_INPUTS:
        top = REPO / name
        paths = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
        for path in paths:
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_deb(work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    built = subprocess.run(
        [str(REPO / "packaging/build-deb.sh"), str(work)], capture_output=True, text=True
    )
    if built.returncode != 0:
        raise RuntimeError(f"build-deb.sh failed:\n{built.stderr[-3000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


def build_image(suite: str, debs: Path, deb: Path, out: Path) -> Image:
    made = subprocess.run(
        [str(REPO / "tests/vm/build_image.sh"), "image", suite, str(debs), str(deb), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if made.returncode != 0:
        raise RuntimeError(f"build_image.sh failed:\n{made.stdout[-3000:]}{made.stderr[-3000:]}")
    return Image(out)


def ensure_image(suite: str, work: Path, debs: Path | None = None) -> Image:
    """The suite's image in work/image-SUITE: built from the package and the test files as they
    are now, or the one already there when it was built from the same."""
    out = work / f"image-{suite}"
    stamp = out / "inputs.sha256"
    digest = inputs_digest()
    if (out / "disk.img").is_file() and stamp.is_file() and stamp.read_text() == digest:
        return Image(out)
    debs = (debs or REPO / ".test-cache" / DEBS[suite]).resolve()
    if not debs.is_file():
        raise RuntimeError(
            f"no packages at {debs}: run tests/vm/build_image.sh debs {suite} {debs}"
        )
    stamp.unlink(missing_ok=True)
    image = build_image(suite, debs, build_deb(work / "deb"), out.resolve())
    stamp.write_text(digest)
    return image


def said(boot: Boot, kind: str) -> dict[str, Any] | None:
    found = [s for s in boot.said if s["kind"] == kind]
    return found[-1] if found else None


def churn_story(boot: Boot) -> dict[str, Any]:
    """What the churn boot did, from its reports: the plan, the calls, the crash's own account
    (when its line reached the console) or, without it, the calls started and never done."""
    ops = [s for s in boot.said if s["kind"] == "op"]
    done = [s for s in boot.said if s["kind"] == "done"]
    finished = {(d["w"], d["call"], d["pod"]) for d in done}
    unfinished = [
        [o["w"], o["call"], o["pod"]] for o in ops if (o["w"], o["call"], o["pod"]) not in finished
    ]
    runs = [d["s"] for d in done if d["call"] == "run" and d["error"] is None]
    return {
        "plan": said(boot, "plan"),
        "crash": said(boot, "crash"),
        "crashed": "sysrq: Trigger a crash" in boot.serial,
        "no_crash": said(boot, "no-crash") is not None,
        "calls": len(ops),
        "errors": [d for d in done if d["error"] is not None],
        "unfinished": unfinished,
        "run_seconds": sorted(runs),
        "seconds": round(boot.seconds, 1),
    }


def held_back(policy: str, units: dict[str, dict[str, str]]) -> float:
    """How long the policy's unit held containerd back: from its start (systemd stamps
    InactiveExit at the fork) until it was up, as systemd recorded them; 0 with no such unit."""
    name = HOLDING_UNIT.get(policy)
    if name is None:
        return 0.0
    state = units[name]
    up = int(state.get("ActiveEnterTimestampMonotonic") or 0)
    stamps = [int(state.get(k) or 0) for k in ("InactiveExitTimestampMonotonic",)]
    stamps += [int(state.get("ExecMainStartTimestampMonotonic") or 0)]
    started = min((s for s in stamps if s > 0), default=0)
    if not up or not started:
        return 0.0
    return round((up - started) / 1e6, 3)


def unaccounted_quarantine(facts: dict[str, Any]) -> list[str]:
    """This boot's quarantined files that no record of the reaper names, or that lack their
    JSON sidecar; none when a record says records were cut (MORE: the JSON report has them)."""
    records = facts["journal"]
    if any(r.get("CNI_REAPER_EVENT") == "more" for r in records):
        return []
    mine = [p for p in facts["quarantine"] if p.startswith(QUARANTINE + facts["boot_id"] + "/")]
    named = {
        str(r["CNI_REAPER_QUARANTINED_TO"]) for r in records if "CNI_REAPER_QUARANTINED_TO" in r
    }
    data = [p for p in mine if not p.endswith(".json")]
    loose = [p for p in data if p not in named]
    loose += [p for p in data if p + ".json" not in mine]
    loose += [p for p in mine if p.endswith(".json") and p[: -len(".json")] not in mine]
    return sorted(set(loose))


def judge(policy: str, boot: Boot, work: Path) -> dict[str, Any]:
    """One policy boot's figures; error when the guest did not report what they need."""
    outcome: dict[str, Any] = {
        "policy": policy,
        "serial": sorted(str(p) for p in work.glob("*.log")),
        "seconds": round(boot.seconds, 1),
    }
    facts, teardown = said(boot, "boot"), said(boot, "teardown")
    if facts is None or teardown is None:
        error = said(boot, "error")
        outcome["error"] = error["error"] if error else "the guest never reported its teardown"
        return outcome
    units = facts["units"]
    reaper = units["cni-reaper.service"]
    stuck = [
        {"id": sandbox_id, **result}
        for sandbox_id, result in teardown["teardown"].items()
        if result["stop"] is not None or result["remove"] is not None
    ]
    failed = [
        r for r in facts["journal"] if r.get("CNI_REAPER_EVENT") in ("repair-failed", "failed")
    ]
    outcome.update(
        {
            "found": {
                "results": facts["results"],
                "reserved": facts["reserved"],
                "quarantined": len([p for p in facts["quarantine"] if not p.endswith(".json")]),
            },
            "sandboxes": len(teardown["teardown"]),
            "stuck": stuck + live_stuck(teardown["live"]),
            "live": live_pod(teardown["live"]),
            "left": teardown["left"],
            "leaked": {net: sorted(held) for net, held in teardown["reserved"].items() if held},
            "results_left": sorted(teardown["results"]),
            "unaccounted": unaccounted_quarantine(facts),
            "held_back": held_back(policy, units),
            "reaper": {k: reaper.get(k, "") for k in ("ActiveState", "Result", "ExecMainStatus")},
            "reaper_failed_records": failed,
            "repaired": len(
                [r for r in facts["journal"] if r.get("CNI_REAPER_EVENT") == "repaired"]
            ),
            "reaper_seconds": reaper_seconds(facts["journal"], reaper),
        }
    )
    return outcome


def reaper_seconds(
    records: list[dict[str, Any]], unit: dict[str, str]
) -> dict[str, float | None] | None:
    """The reaper's own account of its run (its journal summary): seconds from its start,
    after the interpreter's and the imports', until its whole plan was made and in all; and
    from its unit's fork until that start (systemd's sandbox, the interpreter, the imports):
    journald stamps the summary as it arrives, on the clock of systemd's stamps."""
    for record in records:
        if record.get("CNI_REAPER_EVENT") == "summary" and record.get("CNI_REAPER_SECONDS"):
            to_plan = record.get("CNI_REAPER_SECONDS_TO_PLAN")
            in_all = float(record["CNI_REAPER_SECONDS"])
            logged = int(record.get("__MONOTONIC_TIMESTAMP") or 0)
            forked = int(unit.get("ExecMainStartTimestampMonotonic") or 0)
            before = (logged - in_all * 1e6 - forked) / 1e6 if logged and forked else None
            return {
                "to_plan": float(to_plan) if to_plan else None,
                "in_all": in_all,
                "before_start": round(before, 3) if before is not None else None,
            }
    return None


def live_stuck(live: dict[str, Any]) -> list[dict[str, Any]]:
    """The new pod, when its own Stop or Remove failed."""
    done = live.get("teardown") or {}
    if done.get("stop") is None and done.get("remove") is None:
        return []
    return [{"id": live["id"], "name": "live-0", **done}]


def live_pod(live: dict[str, Any]) -> dict[str, Any]:
    """What became of the pod started in the policy boot before the crashed boot's sandboxes
    were torn down: the parts of its network that were missing when it started, or that
    changed while they were torn down (none, when it kept its network); and whether it got
    the lowest free address the driver aimed it at, one an earlier pod had held."""
    if live["before"] is None:
        return {"started": False, "error": live["error"], "missing": [], "changed": []}
    before, after = live["before"], live["after"]
    if after is None:
        # The pod's network could no longer be read: gone with the pod, or worse.
        error = live.get("after_error") or "not read after the teardown"
        return {"started": True, "error": error, "missing": [], "changed": ["all"]}
    missing = [n for n in NETWORKS if not before["reserved"].get(n)]
    # Its results files: one per network (containerd 1.6 caches its loopback's too).
    names = "/".join(before["results"])
    missing += [f"{n}'s results file" for n in NETWORKS if f"{n}-{live['id']}-" not in names]
    missing += [] if len(before["inside"]) == len(NETWORKS) else ["addresses in its netns"]
    missing += [] if len(before.get("routes", [])) >= len(NETWORKS) else ["host routes"]
    missing += [] if before["nat_rules"] else ["portmap's rules"]
    changed = [k for k in sorted(before) if after.get(k) != before[k]]
    aimed = live.get("aimed_at") or {}
    got = {n: before["reserved"].get(n, []) for n in aimed}
    return {
        "started": True,
        "error": None,
        "missing": missing,
        "changed": changed,
        "reused": sorted(n for n, a in aimed.items() if a is not None and [a] == got[n]),
    }


def lost_network(outcome: dict[str, Any]) -> str | None:
    """How the policy boot's new pod lost its network, or None when it did not."""
    live = outcome.get("live")
    if live is None:
        return None
    if not live["started"]:
        return f"a new pod could not start: {live['error']}"
    if live["error"]:
        return f"a new pod's network was lost: {live['error']}"
    if live["missing"]:
        return "a new pod started without " + ", ".join(live["missing"])
    if live["changed"]:
        return "a new pod's network changed under the teardown: " + ", ".join(live["changed"])
    return None


def stuck_sandboxes(outcome: dict[str, Any]) -> int:
    """Sandboxes a Stop or Remove failed on, and any the runtime still lists (most often the
    same ones), counted once each."""
    return len({s["id"] for s in outcome["stuck"]} | set(outcome["left"]))


def breaches(outcome: dict[str, Any]) -> list[str]:
    """The invariants of issue 18 this policy boot broke (all of them, for any policy)."""
    if "error" in outcome:
        return [f"no report: {outcome['error']}"]
    broke = []
    stuck = stuck_sandboxes(outcome)
    if stuck:
        broke.append(f"{stuck} sandboxes stuck")
    leaked = sum(len(held) for held in outcome["leaked"].values())
    if leaked:
        broke.append(f"{leaked} addresses leaked")
    if outcome["results_left"]:
        broke.append(f"{len(outcome['results_left'])} results files left")
    lost = lost_network(outcome)
    if lost:
        broke.append(lost)
    if outcome["unaccounted"]:
        broke.append(f"{len(outcome['unaccounted'])} quarantined files unaccounted for")
    if outcome["policy"] == "reaper" and outcome["reaper"]["Result"] != "success":
        broke.append(f"cni-reaper.service: {outcome['reaper']}")
    return broke


def crash_once(
    image: Image, work: Path, seed: int, policies: list[str], window: float = CRASH_WINDOW
) -> dict[str, Any]:
    """One crash at the seed's instant, then its disk booted under each policy."""
    start = time.monotonic()
    here = work / f"crash-{seed}"
    node = Node(image, here / "churn")
    here.joinpath("churn").mkdir(parents=True, exist_ok=True)
    churned = node.boot("churn", f"vmtest.seed={seed} vmtest.crash_window={window}")
    crash: dict[str, Any] = {
        "seed": seed,
        "churn": churn_story(churned),
        "churn_serial": sorted(str(p) for p in (here / "churn").glob("*.log")),
        "policies": {},
    }
    story = crash["churn"]
    if not story["crashed"] or story["plan"] is None:
        crash["error"] = "the churn boot did not crash as planned"
    else:
        for policy in policies:
            branch = node.branch(here / policy)
            booted = branch.boot("campaign-check", POLICIES[policy])
            outcome = judge(policy, booted, here / policy)
            outcome["breaches"] = breaches(outcome)
            outcome["retried"] = branch.retried
            crash["policies"][policy] = outcome
    crash["retried"] = node.retried
    if crash.get("error") is None and crash["policies"].get("reaper", {}).get("breaches"):
        # What replays this breach exactly (tests/test_crash_states.py), the seed does not.
        # Kept or not, the campaign goes on: a failure here is recorded, never raised.
        state = here / "state.tar.xz"
        try:
            missing = crash_state.missing(crash_state.keep(node.overlay, state, scratch=here))
            crash["state"] = str(state)
            if missing:
                crash["state_error"] = "the kept state lacks " + ", ".join(missing)
        except (OSError, subprocess.CalledProcessError) as error:
            crash["state_error"] = f"{type(error).__name__}: {error}"
    crash["seconds"] = round(time.monotonic() - start, 1)
    return crash


def record(path: Path, crash: dict[str, Any]) -> None:
    """Add the crash to the work dir's record of every crash, by seed (as its crash-SEED dir):
    a seed run again replaces its entry."""
    crashes = json.loads(path.read_text()) if path.is_file() else []
    crashes = [c for c in crashes if c["seed"] != crash["seed"]] + [crash]
    crashes.sort(key=lambda c: c["seed"])
    path.with_name(path.name + ".tmp").write_text(json.dumps(crashes, indent=1, sort_keys=True))
    path.with_name(path.name + ".tmp").replace(path)


def campaign(
    image: Image,
    work: Path,
    seeds: list[int],
    policies: list[str],
    window: float = CRASH_WINDOW,
    log: Any = None,
) -> list[dict[str, Any]]:
    crashes = []
    # Which build of the package and the guest each crash ran: a campaign resumed in the same
    # work dir (more seeds) is one campaign only while this stays the same.
    stamp = image.dir / "inputs.sha256"
    built_from = stamp.read_text() if stamp.is_file() else None
    for seed in seeds:
        crash = crash_once(image, work, seed, policies, window)
        crash["image_inputs"] = built_from
        crashes.append(crash)
        record(work / "campaign.json", crash)
        if log is not None:
            log(one_line(crash))
    return crashes


def one_line(crash: dict[str, Any]) -> str:
    plan = crash["churn"]["plan"] or {}
    said_crash = crash["churn"]["crash"] or {}
    flight = said_crash.get("in_flight")
    trigger = "CNI call" if plan.get("trigger") == "call" else "file event"
    parts = [
        f"seed {crash['seed']}: crash {plan.get('crash_delay')} s after {trigger} "
        f"{plan.get('crash_at')} ({said_crash.get('cause')}; in flight: {flight}), "
        f"{crash['seconds']} s"
    ]
    if "error" in crash:
        parts.append(f"ERROR {crash['error']}")
    for policy, outcome in crash["policies"].items():
        parts.append(f"  {policy}: " + ("; ".join(outcome["breaches"]) or "every invariant held"))
    return "\n".join(parts)


def table(crashes: list[dict[str, Any]], policies: list[str]) -> str:
    """Per policy: the crashes, and in how many of them (and how many in all) sandboxes were
    stuck, addresses leaked, results files left; the time its unit held containerd back."""
    rows = [
        (
            "policy",
            "crashes",
            "stuck (crashes/sandboxes)",
            "leaked (crashes/addresses)",
            "results left (crashes/files)",
            "unaccounted",
            "new pod lost its network",
            "new pod on a reused address",
            "held back s (median/max)",
        )
    ]
    for policy in policies:
        outcomes = [c["policies"][policy] for c in crashes if policy in c["policies"]]
        judged = [o for o in outcomes if "error" not in o]
        stuck = [stuck_sandboxes(o) for o in judged]
        leaked = [sum(len(h) for h in o["leaked"].values()) for o in judged]
        left = [len(o["results_left"]) for o in judged]
        loose = [len(o["unaccounted"]) for o in judged]
        lost = [o for o in judged if lost_network(o)]
        reused = [o for o in judged if o.get("live", {}).get("reused")]
        held = [o["held_back"] for o in judged]
        errors = len(outcomes) - len(judged)
        rows.append(
            (
                policy,
                f"{len(outcomes)}" + (f" ({errors} unreported)" if errors else ""),
                f"{sum(1 for n in stuck if n)}/{sum(stuck)}",
                f"{sum(1 for n in leaked if n)}/{sum(leaked)}",
                f"{sum(1 for n in left if n)}/{sum(left)}",
                str(sum(loose)),
                str(len(lost)),
                str(len(reused)),
                f"{statistics.median(held):.2f}/{max(held):.2f}" if held else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def reaper_account(crashes: list[dict[str, Any]]) -> str | None:
    """Where the reaper policy's hold went, by medians: the unit as systemd timed it, the
    reaper's run as it timed itself (from its start, after the interpreter's and the
    imports'), the part of that until its whole plan was made, and per boot the rest."""
    outcomes = [c["policies"]["reaper"] for c in crashes if "reaper" in c["policies"]]
    timed = [
        o
        for o in outcomes
        if o.get("reaper_seconds")
        and o["reaper_seconds"]["to_plan"] is not None
        and o.get("held_back")
    ]
    if not timed:
        return None
    held = statistics.median(o["held_back"] for o in timed)
    in_all = statistics.median(o["reaper_seconds"]["in_all"] for o in timed)
    to_plan = statistics.median(o["reaper_seconds"]["to_plan"] for o in timed)
    rest = statistics.median(o["held_back"] - o["reaper_seconds"]["in_all"] for o in timed)
    before = [
        o["reaper_seconds"]["before_start"]
        for o in timed
        if o["reaper_seconds"].get("before_start") is not None
    ]
    before_start = (
        f", {statistics.median(before):.2f} s of it from the unit's fork until the run's "
        "start (systemd's sandbox, the interpreter's start, the imports)"
        if before
        else ""
    )
    return (
        f"reaper, {len(timed)} boots (medians): held containerd back {held:.2f} s; its run "
        f"{in_all:.2f} s from its start, {to_plan:.2f} s of it until the plan was made; the "
        f"rest {rest:.2f} s{before_start}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.vm.campaign", description=__doc__)
    parser.add_argument("--suite", choices=sorted(DEBS), default="bookworm")
    parser.add_argument("--crashes", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default="reaper,none,rm-results")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--debs", type=Path, help="the suite's packages (build_image.sh debs)")
    parser.add_argument("--window", type=float, default=CRASH_WINDOW, help="seconds")
    args = parser.parse_args(argv)
    policies = args.policies.split(",")
    for policy in policies:
        if policy not in POLICIES:
            parser.error(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    reason = have_tools()
    if reason:
        print(f"campaign: {reason}", file=sys.stderr)
        return 2
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    image = ensure_image(args.suite, work, args.debs)
    seeds = [args.seed + i for i in range(args.crashes)]
    crashes = campaign(image, work, seeds, policies, args.window, log=print)
    print(f"\n{args.suite}, {len(crashes)} crashes, seeds {seeds[0]}..{seeds[-1]}:")
    print(table(crashes, policies))
    account = reaper_account(crashes)
    if account:
        print(account)
    per_crash = [c["seconds"] for c in crashes]
    print(f"seconds per crash (every boot): median {statistics.median(per_crash):.0f}")
    print(f"every crash: {work / 'campaign.json'}")
    failed = [c for c in crashes if "error" in c or c["policies"].get("reaper", {}).get("breaches")]
    for crash in failed:
        print(f"REAPER BREACH: {one_line(crash)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
