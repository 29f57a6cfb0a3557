#!/usr/bin/env bash
# Installs the Debian packages the local node and the image build need, without
# starting any of their services (there is no systemd here, and a started
# containerd or dockerd would use the system-wide paths agentq keeps clear of).
#
# usage: install-deps.sh PACKAGE...   (as root; a no-op for packages already installed)
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing Debian packages: ${missing[*]}; install them as root with apt-get" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
# invoke-rc.d asks policy-rc.d whether to start a service: 101 means no. Ours only if
# the machine has none, removed again afterwards.
policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; own_policy=1
fi
trap '[ -n "$own_policy" ] && rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt_get=(apt-get -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends)
"${apt_get[@]}" install "${missing[@]}" >/dev/null 2>&1 || {
  apt-get -qq -o DPkg::Lock::Timeout=600 update >/dev/null
  "${apt_get[@]}" install "${missing[@]}" >/dev/null
}
