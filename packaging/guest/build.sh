#!/bin/bash
# Build cryo's guest image: the Debian cloud kernel and an initrd whose /init is
# cryo-agent.
#
#   packaging/guest/build.sh OUTDIR
#
# Writes OUTDIR/vmlinuz, OUTDIR/initrd.img and OUTDIR/guest.json. Needs root on
# Debian 12 and Go; kmod (depmod) and cpio are installed when missing; the
# initrd is zstd-compressed when zstd is there, gzip otherwise. Add
# "cryo.debug=1" to the kernel command line for the agent's debug log.
# The kernel package is cached in $CRYO_GUEST_CACHE (/var/cache/cryo/guest) by
# version, so a re-run only rebuilds the agent and the initrd.
set -euo pipefail

OUT=${1:?usage: build.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${CRYO_GUEST_CACHE:-/var/cache/cryo/guest}
META=${CRYO_GUEST_KERNEL_META:-linux-image-cloud-amd64}
# Modules the guest needs; everything else it uses (ext4, devtmpfs, cgroup2,
# overlay is not used) is built in. Dependencies come from modules.dep.
MODULES=(virtio_pci virtio_console virtio_blk virtio_net)

log() { echo "build.sh: $*" >&2; }

command -v go >/dev/null || { log "go not found on PATH"; exit 1; }
missing=()
command -v depmod >/dev/null || missing+=(kmod)
command -v cpio >/dev/null || missing+=(cpio)
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
		{ apt-get update -qq && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
fi

kernel_pkg() { apt-cache depends "$META" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
PKG=$(kernel_pkg || true)
if [ -z "$PKG" ]; then
	log "apt-cache knows no $META; running apt-get update"
	apt-get update -qq
	PKG=$(kernel_pkg)
fi
[ -n "$PKG" ] || { log "cannot resolve $META"; exit 1; }
PKGVER=$(apt-cache show "$PKG" | awk '/^Version:/{print $2; exit}')
KVER=${PKG#linux-image-}
KDIR=$CACHE/${PKG}_${PKGVER}
if [ ! -e "$KDIR/.done" ]; then
	log "fetching $PKG $PKGVER into $KDIR"
	rm -rf "$KDIR" && mkdir -p "$KDIR/deb"
	chown _apt "$KDIR/deb" 2>/dev/null || true # apt-get download drops privileges to _apt
	(cd "$KDIR/deb" && apt-get download -q "$PKG=$PKGVER")
	dpkg-deb -x "$KDIR"/deb/*.deb "$KDIR/x"
	depmod -b "$KDIR/x" "$KVER"
	touch "$KDIR/.done"
fi
X=$KDIR/x
MODDIR=$X/lib/modules/$KVER
VMLINUZ=$X/boot/vmlinuz-$KVER
CONFIG=$X/boot/config-$KVER

# Built-ins the agent relies on.
for opt in CONFIG_EXT4_FS CONFIG_DEVTMPFS CONFIG_CGROUPS CONFIG_MEMCG CONFIG_PID_NS CONFIG_UTS_NS CONFIG_IPC_NS CONFIG_UNIX98_PTYS; do
	grep -q "^$opt=y" "$CONFIG" || { log "$PKG: $opt is not built in"; exit 1; }
done

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
R=$W/root
mkdir -p "$R"/{dev,proc,sys,run,tmp,lib/modules}

log "building cryo-agent"
VERSION=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo dev)
(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -buildvcs=false \
	-ldflags "-s -w -buildid= -X github.com/cryo-runtime/cryo/agent/guest.Version=$VERSION" \
	-o "$R/init" ./cmd/cryo-agent)

# Modules in dependency order (modules.dep lists the deepest dependency last).
order=()
for m in "${MODULES[@]}"; do
	line=$(grep -E "(^|/)${m}\.ko(\.[a-z]+)?:" "$MODDIR/modules.dep") || { log "module $m not found"; exit 1; }
	read -r -a deps <<<"${line#*:}"
	for ((i = ${#deps[@]} - 1; i >= 0; i--)); do order+=("${deps[i]}"); done
	order+=("${line%%:*}")
done
: >"$R/modules.load"
for p in $(printf '%s\n' "${order[@]}" | awk '!seen[$0]++'); do
	name=$(basename "$p")
	case "$name" in
	*.ko) cp "$MODDIR/$p" "$R/lib/modules/$name" ;;
	*.ko.xz) xz -dc "$MODDIR/$p" >"$R/lib/modules/${name%.xz}"; name=${name%.xz} ;;
	*.ko.zst) zstd -qdc "$MODDIR/$p" >"$R/lib/modules/${name%.zst}"; name=${name%.zst} ;;
	*) log "unknown module file $p"; exit 1 ;;
	esac
	echo "/lib/modules/$name" >>"$R/modules.load"
done
log "modules: $(tr '\n' ' ' <"$R/modules.load")"

# Reproducible archive: fixed order, owners and times.
find "$R" -exec touch -h -d @0 {} +
if grep -q '^CONFIG_RD_ZSTD=y' "$CONFIG" && command -v zstd >/dev/null; then
	COMPRESS=(zstd -q -19 --no-progress) COMP=zstd
else
	COMPRESS=(gzip -n -9) COMP=gzip
fi
mkdir -p "$OUT"
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --reproducible --quiet | "${COMPRESS[@]}") >"$W/initrd.img"
install -m 0644 "$VMLINUZ" "$OUT/vmlinuz"
install -m 0644 "$W/initrd.img" "$OUT/initrd.img"

sha() { sha256sum "$1" | cut -d' ' -f1; }
cat >"$OUT/guest.json" <<JSON
{
  "kernelPackage": "$PKG",
  "kernelPackageVersion": "$PKGVER",
  "kernelRelease": "$KVER",
  "agentVersion": "$VERSION",
  "initrdCompression": "$COMP",
  "kernelCmdline": "console=ttyS0 panic=-1 quiet",
  "modules": [$(sed 's/.*/"&"/' "$R/modules.load" | paste -sd, -)],
  "vmlinuzSha256": "$(sha "$OUT/vmlinuz")",
  "initrdSha256": "$(sha "$OUT/initrd.img")",
  "agentSha256": "$(sha "$R/init")"
}
JSON
log "wrote $OUT/vmlinuz $OUT/initrd.img $OUT/guest.json"
