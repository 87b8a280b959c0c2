#!/usr/bin/env bash
# The demo: a private containerd with the cryo runtime runs a container in a
# QEMU VM and prints its output. Everything lives under $DEMO_DIR (the guest
# RAM files under /dev/shm/, in a directory of the same name) and is
# removed at the end.
#
# Needs: `make build deps-demo` (make demo does both); run as root.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/demo-lock.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CRYO_BIN:-$ROOT/_output/bin}
GUEST=${CRYO_GUEST_DIR:-$ROOT/_output/guest}
TOOLS=${CRYO_TOOLS:-/var/cache/cryo/tools}
DEMO_DIR=$(mktemp -d /tmp/cryo-demo.XXXX)
STATE_ROOT=/run/cryo-demo
# The guest RAM files (tmpfs): the demo's own directory, not the default
# /dev/shm, so that none outlives it.
MEMORY_DIR=/dev/shm/$(basename "$DEMO_DIR")
export PATH="$BIN:$TOOLS/bin:$PATH"
NS=cryo-demo
# ctr prints containerd's deprecation warnings on every call (a cgroup v1
# host gets one each time): about the host, nothing the demo's user can act
# on. containerd's own log (in $DEMO_DIR) still records them.
export CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1
CTR="ctr -a $DEMO_DIR/containerd.sock -n $NS"
# ctr's task I/O FIFOs go under $DEMO_DIR, not to the host's
# /run/containerd/fifo, where a detached container's stay after it.
EXEC="$CTR task exec --fifo-dir $DEMO_DIR/fifo"
CRYOCTL="cryoctl --config $DEMO_DIR/cryo.toml"
IMAGE=cryo.local/busybox:1

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() {
	set +e
	for t in $($CTR task ls -q 2>/dev/null); do $CTR task rm -f "$t" >/dev/null 2>&1; done
	for c in $($CTR c ls -q 2>/dev/null); do $CTR c rm "$c" >/dev/null 2>&1; done
	[ -n "${CPID:-}" ] && kill "$CPID" 2>/dev/null && wait "$CPID" 2>/dev/null
	pkill -9 -f "qemu-system.*$STATE_ROOT" 2>/dev/null
	grep " $DEMO_DIR/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
	rm -rf "$DEMO_DIR" "$STATE_ROOT" "$MEMORY_DIR"
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
memory_dir = "$MEMORY_DIR"

[runtime]
state_root = "$STATE_ROOT"
image_cache = "$DEMO_DIR/images"
disk_root = "$DEMO_DIR/disks"

[snapshot]
cache_dir = "$DEMO_DIR/cache"

[stores]
allowed = ["file://$DEMO_DIR/store/"]
TOML
cat "$DEMO_DIR/cryo.toml"
mkdir -m 0700 "$MEMORY_DIR"

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
RUN="$CTR run --fifo-dir $DEMO_DIR/fifo --runtime io.containerd.cryo.v2 --runtime-config-path $DEMO_DIR/cryo.toml"
echo "host kernel:  $(uname -r)"
set +e
$RUN --rm "$IMAGE" demo1 sh -c 'echo "hello from a cryo VM"; echo "guest kernel: $(uname -r)"; exit 3'
code=$?
set -e
echo "exit code $code"
[ "$code" = 3 ] || { echo "demo: unexpected exit code" >&2; tail -30 "$DEMO_DIR/containerd.log"; exit 1; }

now() { date +%s.%N; }
first_exec() { # wait until the container answers an exec
	for i in $(seq 600); do $EXEC --exec-id "probe$i" "$1" true >/dev/null 2>&1 && return 0; sleep 0.05; done
	return 1
}

say "a warm workload: a counter and a random secret in RAM only"
WORK='head -c 8 /dev/urandom | od -An -tx1 | tr -d " \n" > /dev/shm/secret; i=0; while true; do i=$((i+1)); echo $i > /dev/shm/n.new; mv /dev/shm/n.new /dev/shm/n; sleep 0.1; done'
t0=$(now)
$RUN -d "$IMAGE" agent sh -c "$WORK"
first_exec agent
t_cold=$(echo "$(now) - $t0" | bc)
sleep 2
echo "source:   counter $($EXEC --exec-id s1 agent cat /dev/shm/n), secret $($EXEC --exec-id s2 agent cat /dev/shm/secret), boot $($EXEC --exec-id s3 agent cat /proc/sys/kernel/random/boot_id)"

say "checkpoint it: cryoctl checkpoint agent --to file://$DEMO_DIR/store/agent:v1"
$CRYOCTL checkpoint -n $NS agent --to "file://$DEMO_DIR/store/agent:v1"
$CRYOCTL inspect "file://$DEMO_DIR/store/agent:v1" | sed -n '1,12p'

say "restore a copy from the annotation cryo.dev/restore-from"
t0=$(now)
$RUN -d --annotation "cryo.dev/restore-from=file://$DEMO_DIR/store/agent:v1" "$IMAGE" clone sh -c 'echo this never runs: the clone continues the checkpointed workload'
first_exec clone
t_restore=$(echo "$(now) - $t0" | bc)
echo "clone:    counter $($EXEC --exec-id c1 clone cat /dev/shm/n), secret $($EXEC --exec-id c2 clone cat /dev/shm/secret), boot $($EXEC --exec-id c3 clone cat /proc/sys/kernel/random/boot_id)"
echo "(same secret and boot id, counter carried on: a restore, not a reboot)"

say "cold boot vs restore, to first exec"
printf '  cold boot  %6.2fs\n  restore    %6.2fs   (%.2fx)\n' "$t_cold" "$t_restore" "$(echo "$t_restore / $t_cold" | bc -l)"
for c in agent clone; do $CTR task kill -s SIGKILL "$c" >/dev/null 2>&1 || true; done
say "done"
