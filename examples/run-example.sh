#!/usr/bin/env bash
# The README's first command: install cni-reaper in a venv, stage the shipped crashed-node tree
# as a node that has just rebooted after a crash, show the dry-run plan, then repair the copy.
#
# The repair runs the real CNI plugins (Debian's containernetworking-plugins) in a private
# network namespace, and, as with any --root, confined to the tree's CNI state in a private
# mount namespace, so it needs root; the machine's own network and /var/lib/cni are never
# touched. The shipped tree itself is never modified.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

if [ "$(id -u)" = 0 ] && [ ! -x /usr/lib/cni/host-local ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        containernetworking-plugins iptables iproute2 util-linux >/dev/null
fi
venv="$repo/.venv-example"
[ -x "$venv/bin/cni-reaper" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q -e "$repo"; }
reaper="$venv/bin/cni-reaper"

work=$(mktemp -d)
node="$work/node"
cp -r "$here/crashed-node" "$node"
chmod 700 "$node/var/lib/cni/results"

# The boot world: boot A shut down cleanly, boot B wrote the files above and lost power,
# boot C (now) began a few seconds after that, as wtmp records it (written with utmpdump).
written=$(date +%s)
sleep 3
now=$(date +%s)
stamp() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S,000000+00:00; }
record() { printf '[%s] [00000] [~~  ] [%-8s] [~           ] [6.1.0-27-amd64      ] [0.0.0.0        ] [%s]\n' "$1" "$2" "$(stamp "$3")"; }
mkdir -p "$node/var/log" "$node/proc/sys/kernel/random"
{
    record 2 reboot $((written - 7200))
    record 1 shutdown $((written - 3700))
    record 2 reboot $((written - 3600))
    record 2 reboot "$now"
} | utmpdump --reverse --output "$node/var/log/wtmp" 2>/dev/null
printf 'cpu  1 0 1 1 0 0 0 0 0 0\nbtime %s\n' $((now - 1)) > "$node/proc/stat"
cat /proc/sys/kernel/random/uuid > "$node/proc/sys/kernel/random/boot_id"

echo "### cni-reaper --dry-run on $node"
set +e
"$reaper" --dry-run --root "$node" --bin-dir /usr/lib/cni
echo "### exit status $?"
set -e

if [ "$(id -u)" != 0 ]; then
    echo "### the repair runs real plugins in a private namespace: run this as root to see it"
    exit 0
fi
echo
echo "### cni-reaper on $node (real plugins, private network namespace)"
set +e
unshare --net --mount --propagation private "$reaper" --root "$node" --bin-dir /usr/lib/cni
echo "### exit status $?"
set -e
echo
echo "### left in the results dir:"
ls "$node/var/lib/cni/results"
echo "### IPs still reserved in host-local's store:"
(cd "$node/var/lib/cni/networks" && grep -l . -r . | grep -v last_reserved | sort)
echo "### quarantine:"
(cd "$node/var/lib/cni-reaper/quarantine" && find . -type f | sort)
echo "### the tree is kept at $work for a look; remove it when done"
