#!/bin/sh
# The Debian mirror apt uses on this machine (deb822 sources first, then sources.list), for
# debootstrap; prints nothing if there is none, and debootstrap takes its default.
sed -n 's|^URIs: *\(.*/debian\)/*$|\1|p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1 | grep . ||
    awk '$1 == "deb" && $2 ~ /\/debian\/?$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true
