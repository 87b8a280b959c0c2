#!/usr/bin/env bash
# The CRI part of the demo: a private containerd with its CRI plugin and the
# cryo runtime handler, a CNI bridge in a network namespace of its own (so
# nothing touches the host's network), and pods run with crictl.
#
#   hack/demo-cri.sh           run a pod, print its IP and output, clean up
#   . hack/demo-cri.sh         (sourced) only define the functions:
#     cri_up                     start containerd with CRI; sets CRI_DIR
#                                (CRI_RUNC=1: also the handler runc;
#                                CRI_ALLOWED: more [stores] allowed entries,
#                                TOML strings separated by commas)
#     cri_run_pod NAME 'SCRIPT' [KEY=VALUE...]
#                                runp + create + start a busybox container
#                                running sh -c SCRIPT, with pod annotations;
#                                sets CRI_POD and CRI_CTR
#     cri_pod_ip POD             the pod's IP
#     cri_wait_log CTR TEXT      wait until the container's log holds TEXT
#     cri_on_bridge CMD...       run CMD at the host end of the pod network
#     crictl ARGS...             crictl against the private containerd
#     cri_down                   remove pods, stop containerd, remove everything
#
# Needs: `make build deps-demo`; run as root.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/demo-lock.sh"
CRI_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CRI_BIN=${CRYO_BIN:-$CRI_ROOT/_output/bin}
CRI_GUEST=${CRYO_GUEST_DIR:-$CRI_ROOT/_output/guest}
CRI_TOOLS=${CRYO_TOOLS:-/var/cache/cryo/tools}
CRI_NETNS=cryo-demo-cri
CRI_STATE_ROOT=/run/cryo-demo-cri
CRI_SUBNET_PREFIX=10.88.200
CRI_IMAGE=cryo.local/busybox:1
CRI_PAUSE=cryo.local/pause:1
export PATH="$CRI_BIN:$CRI_TOOLS/bin:$PATH"
# ctr would print containerd's deprecation warnings (cgroup v1 hosts) on
# every call: nothing the demo's user can act on (see hack/demo.sh).
export CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1

crictl() { nsenter --net="/run/netns/$CRI_NETNS" "$CRI_TOOLS/bin/crictl" --config "$CRI_DIR/crictl.yaml" "$@"; }
cri_on_bridge() { nsenter --net="/run/netns/$CRI_NETNS" "$@"; }

cri_up() {
	local f
	for f in "$CRI_BIN/containerd-shim-cryo-v2" "$CRI_GUEST/vmlinuz" "$CRI_GUEST/initrd.img" "$CRI_TOOLS/bin/crictl" "$CRI_TOOLS/bin/bridge"; do
		[ -e "$f" ] || { echo "demo-cri: $f missing: run make build deps-demo" >&2; return 1; }
	done
	CRI_DIR=$(mktemp -d /tmp/cryo-demo-cri.XXXX)
	# The guest RAM files: the demo's own tmpfs directory (cri_down removes
	# it), not the default /dev/shm.
	mkdir -m 0700 "/dev/shm/${CRI_DIR##*/}"
	ip netns add "$CRI_NETNS"
	ip -n "$CRI_NETNS" link set lo up
	cat > "$CRI_DIR/cryo.toml" <<TOML
[hypervisor]
kernel = "$CRI_GUEST/vmlinuz"
initrd = "$CRI_GUEST/initrd.img"
accel = "tcg"
default_memory = 512
memory_dir = "/dev/shm/${CRI_DIR##*/}"

[runtime]
state_root = "$CRI_STATE_ROOT"
image_cache = "$CRI_DIR/images"
disk_root = "$CRI_DIR/disks"

[snapshot]
cache_dir = "$CRI_DIR/cache"

[stores]
allowed = ["file://$CRI_DIR/store/"${CRI_ALLOWED:+, $CRI_ALLOWED}]
TOML
	mkdir -p "$CRI_DIR/net.d"
	cat > "$CRI_DIR/net.d/10-cryo.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "cryo-demo",
 "plugins": [{"type": "bridge", "bridge": "cryobr0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$CRI_DIR/ipam",
            "ranges": [[{"subnet": "$CRI_SUBNET_PREFIX.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
JSON
	# The CRI sections come from stack.CRIConfig, which the integration
	# tests write too.
	{ cat <<TOML
version = 3
root = "$CRI_DIR/root"
state = "$CRI_DIR/state"
[grpc]
  address = "$CRI_DIR/containerd.sock"
[ttrpc]
  address = "$CRI_DIR/containerd.sock.ttrpc"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$CRI_DIR/opt"
  [plugins."io.containerd.shim.v1.manager"]
    socket_dir = "$CRI_DIR/s"
TOML
	  (cd "$CRI_ROOT" && go run ./hack/criconfig -pause "$CRI_PAUSE" -cryo-config "$CRI_DIR/cryo.toml" \
		-cni-bin "$CRI_TOOLS/bin" -cni-conf "$CRI_DIR/net.d" ${CRI_RUNC:+-runc-root "$CRI_DIR/runc"}); } > "$CRI_DIR/containerd.toml"
	printf 'runtime-endpoint: unix://%s/containerd.sock\nimage-endpoint: unix://%s/containerd.sock\ntimeout: 120\n' "$CRI_DIR" "$CRI_DIR" > "$CRI_DIR/crictl.yaml"
	nsenter --net="/run/netns/$CRI_NETNS" containerd --config "$CRI_DIR/containerd.toml" > "$CRI_DIR/containerd.log" 2>&1 &
	CRI_CONTAINERD_PID=$!
	local ctr="ctr -a $CRI_DIR/containerd.sock -n k8s.io" i
	for i in $(seq 100); do $ctr version >/dev/null 2>&1 && break; sleep 0.1; done
	(cd "$CRI_ROOT" && go run ./hack/mkimage "$CRI_DIR/busybox.tar" "$CRI_IMAGE" &&
		go run ./hack/mkimage "$CRI_DIR/pause.tar" "$CRI_PAUSE" sleep inf)
	$ctr image import "$CRI_DIR/busybox.tar" >/dev/null
	$ctr image import "$CRI_DIR/pause.tar" >/dev/null
	for i in $(seq 100); do [ "$(crictl images -q 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
}

# cri_run_pod NAME SCRIPT [KEY=VALUE...]
# cri_run_pod POD SCRIPT [ANNOTATION=VALUE...]: its container has the pod's
# name, or $CRI_CTR_NAME (a restored pod's container takes the checkpointed
# one over by name).
cri_run_pod() {
	local name=$1 script=$2; shift 2
	local ctr=${CRI_CTR_NAME:-$name}
	local ann="" kv
	for kv in "$@"; do ann="$ann${ann:+,}\"${kv%%=*}\": \"${kv#*=}\""; done
	# No "linux" section: its cgroup_parent (the host cgroup the kubelet
	# names) means nothing to a pod in a VM, and crictl warns about a linux
	# section without one.
	cat > "$CRI_DIR/pod-$name.json" <<JSON
{"metadata": {"name": "$name", "namespace": "default", "uid": "$name-uid", "attempt": 1},
 "hostname": "$name", "log_directory": "$CRI_DIR/logs/$name", "annotations": {$ann}}
JSON
	local q=${script//\\/\\\\}
	q=${q//\"/\\\"}
	cat > "$CRI_DIR/ctr-$name.json" <<JSON
{"metadata": {"name": "$ctr"}, "image": {"image": "$CRI_IMAGE"},
 "command": ["sh", "-c", "$q"], "log_path": "$ctr.log", "linux": {}}
JSON
	CRI_POD=$(crictl runp --runtime cryo "$CRI_DIR/pod-$name.json")
	CRI_CTR=$(crictl create "$CRI_POD" "$CRI_DIR/ctr-$name.json" "$CRI_DIR/pod-$name.json")
	crictl start "$CRI_CTR" >/dev/null
}

cri_pod_ip() { crictl inspectp -o go-template --template '{{.status.network.ip}}' "$1"; }

cri_wait_log() {
	local i
	for i in $(seq 600); do crictl logs "$1" 2>&1 | grep -q "$2" && return 0; sleep 0.1; done
	echo "demo-cri: no '$2' in the log of $1" >&2
	return 1
}

cri_down() {
	set +e
	if [ -n "${CRI_DIR:-}" ] && [ -S "$CRI_DIR/containerd.sock" ]; then
		local p
		for p in $(crictl pods -q 2>/dev/null); do crictl stopp "$p" >/dev/null 2>&1; crictl rmp -f "$p" >/dev/null 2>&1; done
	fi
	[ -n "${CRI_CONTAINERD_PID:-}" ] && kill "$CRI_CONTAINERD_PID" 2>/dev/null && wait "$CRI_CONTAINERD_PID" 2>/dev/null
	ip netns del "$CRI_NETNS" 2>/dev/null
	if [ -n "${CRI_DIR:-}" ]; then
		grep " $CRI_DIR/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
		rm -rf "$CRI_DIR" "/dev/shm/${CRI_DIR##*/}"
	fi
	rm -rf "$CRI_STATE_ROOT"
	# libcni's results of a pod whose network was never torn down: the
	# demo network's (cryo-demo-<pod id>-eth0) and the loopback's.
	local f id
	for f in /var/lib/cni/results/cryo-demo-*; do
		[ -e "$f" ] || continue
		id=${f%-*}
		rm -f "$f" "/var/lib/cni/results/cni-loopback-${id##*-}-lo"
	done
	set -e
}

# Run as a script: a pod, its kubelet-path checkpoint, a second pod restored
# from it, both pods' IPs and the carried-over state.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
	trap cri_down EXIT
	say "start a private containerd with CRI and the cryo runtime handler"
	cri_up
	say "a pod with the cryo RuntimeClass handler: crictl runp --runtime cryo + create + start"
	t0=$(date +%s.%N)
	cri_run_pod agent 'head -c 8 /dev/urandom | od -An -tx1 | tr -d " \n" > /dev/shm/secret; echo "hello from pod $(hostname), kernel $(uname -r)"; nc -ll -p 7000 -e sh -c "echo counter \$(cat /dev/shm/n) secret \$(cat /dev/shm/secret)" & i=0; while true; do i=$((i+1)); echo $i > /dev/shm/n.new; mv /dev/shm/n.new /dev/shm/n; sleep 0.1; done' \
		"cryo.dev/checkpoint-to=file://$CRI_DIR/store/agent:v1"
	cri_wait_log "$CRI_CTR" "hello from pod"
	t_cold=$(echo "$(date +%s.%N) - $t0" | bc)
	SRC_POD=$CRI_POD SRC_CTR=$CRI_CTR
	SRC_IP=$(cri_pod_ip "$SRC_POD")
	sleep 2
	echo "pod agent: ip $SRC_IP, log: $(crictl logs "$SRC_CTR" 2>&1 | head -1)"
	echo "asked from the host end of the bridge: $(cri_on_bridge sh -c "echo hi | busybox nc -w 3 $SRC_IP 7000")"

	say "the kubelet's checkpoint path: crictl checkpoint --export (publishes to cryo.dev/checkpoint-to)"
	crictl checkpoint --export="$CRI_DIR/agent-checkpoint.tar" "$SRC_CTR" >/dev/null
	echo "exported $(stat -c %s "$CRI_DIR/agent-checkpoint.tar") bytes; the snapshot:"
	cryoctl --config "$CRI_DIR/cryo.toml" inspect "file://$CRI_DIR/store/agent:v1" | sed -n '1,2p'

	say "a second pod restored from the annotation cryo.dev/restore-from"
	t0=$(date +%s.%N)
	CRI_CTR_NAME=agent cri_run_pod agent-clone 'echo this never runs: the clone continues the checkpointed workload' \
		"cryo.dev/restore-from=file://$CRI_DIR/store/agent:v1"
	DST_IP=$(cri_pod_ip "$CRI_POD")
	if crictl logs "$CRI_CTR" 2>&1 | grep -q "this never runs"; then
		echo "demo-cri: the restored container ran its own command beside the checkpointed one" >&2
		exit 1
	fi
	out=""
	for i in $(seq 100); do out=$(cri_on_bridge sh -c "echo hi | busybox nc -w 3 $DST_IP 7000" 2>/dev/null) && [ -n "$out" ] && break; sleep 0.1; done
	t_restore=$(echo "$(date +%s.%N) - $t0" | bc)
	echo "pod agent:       ip $SRC_IP, answers: $(cri_on_bridge sh -c "echo hi | busybox nc -w 3 $SRC_IP 7000")"
	echo "pod agent-clone: ip $DST_IP, answers: $out"
	echo "(the clone carries the secret and the counter over, under its own IP)"
	printf 'runp+create+start until the pod answers: cold %.2fs, restored %.2fs\n' "$t_cold" "$t_restore"
	say "done"
fi
