#!/usr/bin/env bash
# Installs what cryo's build, demo and tests need on a fresh Debian 12 machine
# (as root): Debian packages, then the Go-built tools (hack/tools.sh).
set -euo pipefail
pkgs=(bc qemu-system-x86 qemu-utils e2fsprogs kmod cpio busybox-static iproute2 criu zstd ca-certificates runc)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$(dirname "$0")/tools.sh" "$@"
