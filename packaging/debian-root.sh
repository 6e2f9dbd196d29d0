#!/usr/bin/env bash
# A minimal Debian bookworm root with what the cni-reaper package depends on, as a tar, for
# the test that installs the package into a fresh root (tests/test_packaging.py), and systemd,
# whose systemd-delta and systemd-analyze show there that the drop-ins apply. Built by
# .ci/run before the tests, since tests download nothing; reused while its inputs are the same.
#
# usage (as root): packaging/debian-root.sh OUT.tar
set -euo pipefail
out=$1
include=python3,python3-pyudev,python3-systemd,init-system-helpers,systemd
stamp="bookworm minbase $include"
if [ -s "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "up to date: $out"
    exit 0
fi
mirror=$("$(dirname "$0")/debian-mirror.sh")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include="$include" bookworm "$work/root" $mirror >"$work/log" 2>&1 || {
    tail -n 30 "$work/log" >&2
    exit 1
}
rm -rf "$work/root/var/cache/apt/archives"/*.deb "$work/root/var/lib/apt/lists"/*
mkdir -p "$(dirname "$out")"
tar -C "$work/root" --numeric-owner -cf "$out.tmp" .
mv "$out.tmp" "$out"
echo "$stamp" >"$out.stamp"
echo "built: $out"
