#!/usr/bin/env bash
# A bootable Debian node image for the VM tests (run as root; about a minute): bookworm
# (containerd 1.6, systemd writes wtmp) or trixie (containerd 1.7, wtmpdb and no wtmp).
#
# usage: tests/vm/build_image.sh debs SUITE DEBS.tgz                 # download the packages (CI setup)
#        tests/vm/build_image.sh image SUITE DEBS.tgz PKG.deb OUTDIR  # build OUTDIR/{disk.img,vmlinuz,initrd.img}
#
# "debs" fetches every package into a tarball (debootstrap --make-tarball) and is the only step
# that needs the package mirror: .ci/run does it before the tests, which download nothing.
# "image" unpacks it offline, installs the cni-reaper package with dpkg as packaging/README.md
# tells an image builder, adds the test driver, and writes an ext4 file system image that the
# guest kernel boots directly (no boot loader, no partition table).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
include=systemd,systemd-sysv,udev,dbus,iproute2,iptables,kmod,procps,util-linux
include+=,linux-image-cloud-amd64,initramfs-tools,e2fsprogs
include+=,containerd,runc,containernetworking-plugins
include+=,python3,python3-pyudev,python3-systemd,python3-grpcio,python3-protobuf

step=${1:-} suite=${2:-}
case "$suite" in
bookworm) ;;
# Debian 13's boot records: wtmpdb (Priority: standard, so not in minbase) and its PAM module.
# libre2-11 by name: python3-grpcio depends on the virtual package it provides, which
# debootstrap does not resolve.
trixie) include+=,wtmpdb,libpam-wtmpdb,libre2-11 ;;
*)
    echo "usage: $0 debs SUITE DEBS.tgz | image SUITE DEBS.tgz PKG.deb OUTDIR (SUITE: bookworm, trixie)" >&2
    exit 2
    ;;
esac

case "$step" in
debs)
    out=$3
    stamp="$suite minbase $include"
    if [ -s "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
        echo "up to date: $out"
        exit 0
    fi
    mirror=$("$here/../../packaging/debian-mirror.sh")
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$(dirname "$out")"
    debootstrap --make-tarball="$out.tmp" --variant=minbase --include="$include" \
        "$suite" "$work/root" $mirror >"$work/log" 2>&1 || { tail -n 30 "$work/log" >&2; exit 1; }
    mv "$out.tmp" "$out"
    echo "$stamp" >"$out.stamp"
    echo "downloaded: $out"
    ;;
image)
    debs=$3 deb=$4 out=$5
    mkdir -p "$out"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    R=$work/root
    debootstrap --unpack-tarball="$debs" --variant=minbase --include="$include" \
        "$suite" "$R" >"$work/log" 2>&1 || { tail -n 30 "$work/log" >&2; exit 1; }
    echo vmnode >"$R/etc/hostname"
    echo '/dev/vda / ext4 defaults,errors=remount-ro 0 1' >"$R/etc/fstab"
    chroot "$R" passwd -d root >/dev/null
    # Only what mounting /dev/vda needs in the initramfs; the cloud kernel has ext4 built in.
    sed -i 's/^MODULES=.*/MODULES=list/' "$R/etc/initramfs-tools/initramfs.conf"
    printf 'virtio_pci\nvirtio_blk\n' >>"$R/etc/initramfs-tools/modules"
    chroot "$R" update-initramfs -u -k all >/dev/null 2>&1
    for timer in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer; do
        chroot "$R" systemctl mask "$timer" >/dev/null 2>&1 || true
    done

    # The package, installed as an image builder does it; its postinst enables the unit.
    cp "$deb" "$R/tmp/"
    chroot "$R" dpkg -i "/tmp/$(basename "$deb")" >/dev/null
    rm "$R/tmp/$(basename "$deb")"
    [ "$(chroot "$R" systemctl is-enabled cni-reaper.service)" = enabled ]

    # The node's runtime and network: containerd's CRI with a local pause image, one conflist.
    mkdir -p "$R/etc/containerd" "$R/etc/cni/net.d"
    cp "$here/guest/containerd.toml" "$R/etc/containerd/config.toml"
    cp "$here/guest/10-podnet.conflist" "$R/etc/cni/net.d/"
    # The driver and what it uses.
    lib=$R/usr/local/lib/vmtest
    mkdir -p "$lib/tests"
    cp "$here/guest/driver.py" "$lib/"
    cp "$here/../cri.py" "$lib/tests/cri.py"
    touch "$lib/tests/__init__.py"
    (cd "$here/../.." && python3 -c 'import sys; from tests import pause_image; from pathlib import Path; pause_image.build(Path(sys.argv[1]))' "$lib/pause.tar")
    cp "$here/guest/vmtest.service" "$R/etc/systemd/system/"
    chroot "$R" systemctl enable vmtest.service >/dev/null 2>&1
    # Test-only units, never in the package: bench/run.py's floor program over the results dir,
    # next to the reaper in the timing boot, cold and then warm.
    (cd "$here/../.." && python3 -c 'import sys; from bench.run import FLOOR; sys.stdout.write(FLOOR.lstrip())') >"$lib/floor.py"
    cp "$here/guest/vmtest-floor.service" "$here/guest/vmtest-floor-warm.service" "$R/etc/systemd/system/"
    # And once more, cold, in the shipped unit's sandbox: its [Service] settings but what it
    # runs, its type, exit statuses and timeouts.
    {
        cat "$here/guest/vmtest-floor-hardened.service"
        awk '/^\[/ { service = ($0 == "[Service]") } service && /^[A-Za-z]+=/ {
                key = substr($0, 1, index($0, "=") - 1)
                if (key !~ /^(Type|RemainAfterExit|ExecStart|ExecStop|SuccessExitStatus|TimeoutStartSec|TimeoutStopSec|NotifyAccess)$/) print
            }' "$here/../../systemd/cni-reaper.service"
        printf '\n[Install]\nWantedBy=multi-user.target\n'
    } >"$R/etc/systemd/system/vmtest-floor-hardened.service"
    chroot "$R" systemctl enable vmtest-floor.service vmtest-floor-warm.service vmtest-floor-hardened.service >/dev/null 2>&1
    # And, in a boot of its own, at the reaper's point of the boot, before it.
    cp "$here/guest/vmtest-floor-first.service" "$R/etc/systemd/system/"
    chroot "$R" systemctl enable vmtest-floor-first.service >/dev/null 2>&1
    # The crash campaign's (tests/vm/campaign.py): the second network and the containerd config
    # that attaches pods to both, which its churn boot puts in place (other scenarios keep one
    # network); the EKS-like boot policy's unit, which runs only when the command line asks.
    mkdir -p "$lib/campaign"
    cp "$here/guest/20-ptpnet.conflist" "$here/guest/containerd-campaign.toml" "$lib/campaign/"
    cp "$here/guest/vmtest-rm-results.service" "$R/etc/systemd/system/"
    chroot "$R" systemctl enable vmtest-rm-results.service >/dev/null 2>&1

    chroot "$R" apt-get clean
    rm -rf "$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/locale/*
    cp "$R"/boot/vmlinuz-* "$out/vmlinuz"
    cp "$R"/boot/initrd.img-* "$out/initrd.img"
    rm -f "$out/disk.img"
    truncate -s 2G "$out/disk.img"
    mkfs.ext4 -q -F -L root -d "$R" "$out/disk.img"
    echo "built: $out/disk.img"
    ;;
*)
    echo "usage: $0 debs SUITE DEBS.tgz | image SUITE DEBS.tgz PKG.deb OUTDIR" >&2
    exit 2
    ;;
esac
