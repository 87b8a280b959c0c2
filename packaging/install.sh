#!/usr/bin/env bash
# Installs cryo on a node (as root): the shim and cryoctl, the guest image, a
# default config, and prints the containerd runtime snippet to merge.
#
#   packaging/install.sh [PREFIX]        (default PREFIX=/usr/local)
#   packaging/install.sh --uninstall [PREFIX]
# Run `make build` first.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --uninstall ]; then
	PREFIX=${2:-/usr/local}
	rm -f "$PREFIX/bin/containerd-shim-cryo-v2" "$PREFIX/bin/cryoctl"
	rm -rf /usr/share/cryo
	echo "removed cryo binaries and guest image; /etc/cryo and /var/lib/cryo are kept"
	exit 0
fi
PREFIX=${1:-/usr/local}
install -D -m 0755 "$ROOT/_output/bin/containerd-shim-cryo-v2" "$PREFIX/bin/containerd-shim-cryo-v2"
install -D -m 0755 "$ROOT/_output/bin/cryoctl" "$PREFIX/bin/cryoctl"
install -D -m 0644 "$ROOT/_output/guest/vmlinuz" /usr/share/cryo/vmlinuz
install -D -m 0644 "$ROOT/_output/guest/initrd.img" /usr/share/cryo/initrd.img
if [ ! -e /etc/cryo/config.toml ]; then
	install -D -m 0644 "$ROOT/configs/debian-tcg.toml" /etc/cryo/config.toml
fi
install -d -m 0700 /var/lib/cryo /var/lib/cryo/store /var/lib/cryo/cache /var/lib/cryo/images
echo "installed; merge packaging/containerd/cryo-runtime.toml into /etc/containerd/config.toml and restart containerd"
# The node's dirty limits are every writer's: the admin installs them.
echo "for served guest RAM (lazy restores, [memory] booted = \"served\"): cp $ROOT/packaging/sysctl/90-cryo-dirty.conf /etc/sysctl.d/ && sysctl --system (docs/configuration.md)"
