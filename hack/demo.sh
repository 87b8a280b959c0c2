#!/usr/bin/env bash
# The demo: a private containerd with the cryo runtime runs a container in a
# QEMU VM and prints its output. Everything lives under $DEMO_DIR and is
# removed at the end.
#
# Needs: `make build deps` (make demo does both); run as root.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CRYO_BIN:-$ROOT/_output/bin}
GUEST=${CRYO_GUEST_DIR:-$ROOT/_output/guest}
TOOLS=${CRYO_TOOLS:-/var/cache/cryo/tools}
DEMO_DIR=$(mktemp -d /tmp/cryo-demo.XXXX)
STATE_ROOT=/run/cryo-demo
export PATH="$BIN:$TOOLS/bin:$PATH"
NS=cryo-demo
CTR="ctr -a $DEMO_DIR/containerd.sock -n $NS"
IMAGE=cryo.local/busybox:1

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() {
	set +e
	for t in $($CTR task ls -q 2>/dev/null); do $CTR task rm -f "$t" >/dev/null 2>&1; done
	for c in $($CTR c ls -q 2>/dev/null); do $CTR c rm "$c" >/dev/null 2>&1; done
	[ -n "${CPID:-}" ] && kill "$CPID" 2>/dev/null && wait "$CPID" 2>/dev/null
	pkill -9 -f "qemu-system.*$STATE_ROOT" 2>/dev/null
	grep " $DEMO_DIR/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
	rm -rf "$DEMO_DIR" "$STATE_ROOT"
}
trap cleanup EXIT

for f in "$BIN/containerd-shim-cryo-v2" "$GUEST/vmlinuz" "$GUEST/initrd.img"; do
	[ -e "$f" ] || { echo "demo: $f missing: run make build" >&2; exit 1; }
done

say "cryo config ($DEMO_DIR/cryo.toml)"
cat > "$DEMO_DIR/cryo.toml" <<TOML
[hypervisor]
kernel = "$GUEST/vmlinuz"
initrd = "$GUEST/initrd.img"
accel = "tcg"
default_memory = 512

[runtime]
state_root = "$STATE_ROOT"
image_cache = "$DEMO_DIR/images"
TOML
cat "$DEMO_DIR/cryo.toml"

say "start a private containerd with the cryo runtime"
truncate -s 256M "$DEMO_DIR/scratch.ext4" && mkfs.ext4 -q -F "$DEMO_DIR/scratch.ext4"
sed -e "s|@DIR@|$DEMO_DIR|g" "$ROOT/packaging/containerd/demo-config.toml" > "$DEMO_DIR/containerd.toml"
containerd --config "$DEMO_DIR/containerd.toml" > "$DEMO_DIR/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 100); do $CTR version >/dev/null 2>&1 && break; sleep 0.1; done
$CTR version | sed -n '1,3p'

say "import a small local image (no registry)"
(cd "$ROOT" && go run ./hack/mkimage "$DEMO_DIR/busybox.tar" "$IMAGE")
$CTR image import "$DEMO_DIR/busybox.tar" >/dev/null
$CTR image ls -q

say "run a container in a VM: ctr run --runtime io.containerd.cryo.v2"
echo "host kernel:  $(uname -r)"
start=$(date +%s.%N)
set +e
$CTR run --rm --runtime io.containerd.cryo.v2 --runtime-config-path "$DEMO_DIR/cryo.toml" \
	"$IMAGE" demo1 sh -c 'echo "hello from a cryo VM"; echo "guest kernel: $(uname -r)"; exit 3'
code=$?
set -e
end=$(date +%s.%N)
printf 'exit code %d, cold start to exit %.2fs\n' "$code" "$(echo "$end - $start" | bc)"
[ "$code" = 3 ] || { echo "demo: unexpected exit code" >&2; tail -30 "$DEMO_DIR/containerd.log"; exit 1; }
say "done"
