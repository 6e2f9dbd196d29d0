#!/usr/bin/env bash
# Build cni-reaper_<version>_all.deb, and the native source package (.dsc, .tar.xz, .changes)
# lintian checks with it, from this checkout with the Debian toolchain
# (dpkg-buildpackage, dh-python/pybuild): packaging/debian becomes debian/ of a copy of the
# source tree, so the checkout itself is never written to.
#
# usage: packaging/build-deb.sh OUTDIR
# needs: debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/cni_reaper/__init__.py")
changelog=$(dpkg-parsechangelog -l "$repo/packaging/debian/changelog" -S Version)
if [ "$version" != "$changelog" ]; then
    echo "cni_reaper/__init__.py says $version, packaging/debian/changelog says $changelog" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src="$work/cni-reaper-$version"
mkdir "$src"
cp -r "$repo"/{pyproject.toml,setup.cfg,LICENSE,README.md,cni_reaper,systemd,man} "$src"/
cp -r "$repo/packaging/debian" "$src/debian"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
# The distribution's own Python builds the package, never one a PATH shim (pyenv) puts first.
(cd "$src" && PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc)
cp "$work"/cni-reaper_"$version"{_all.deb,.dsc,.tar.xz,_*.changes,_*.buildinfo} "$out/"
echo "$out/cni-reaper_${version}_all.deb"
