#!/usr/bin/env bash
# The Kubernetes demo: hibernate, resume and fork an agent pod from the
# cluster, with kubectl only.
#
# Setup (scripted): the CRI demo's private containerd (hack/demo-cri.sh's
# cri_up: the cryo handler and a runc one, a CNI bridge in its own network
# namespace), a one-node control plane on it and versitygw on the node IP
# (hack/k8sup: stack.StartK8s and stack.StartS3With, as the integration
# tests start them), the node's [stores.s3] and a namespaced [stores]
# allowed entry s3://snapshots/cryo/{namespace}/, the controller's image
# (`make controller-image`) imported into containerd, the Secret
# cryo-store-credentials and a kustomize overlay over
# packaging/kubernetes/controller (stack.WriteControllerOverlay, as the
# tests write it) applied with kubectl apply -k.
#
# Then, printed as a user types them: an agent pod (runtimeClassName cryo),
# a Checkpoint with keepRunning: false (hibernate), the pod created again
# with cryo.dev/restore-checkpoint (resume), a Checkpoint with keepRunning:
# true and three pods forked from it, a Checkpoint deleted and its tag gone.
#
# Everything is removed at the end (also on failure): pods, VMs, processes,
# the network namespace, mounts, the kubelet's cgroups, files under /tmp,
# and the host sysctls and paths the kubelet changes.
# Needs: `make deps build controller-image`; run as root.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/demo-cri.sh"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd versitygw containerd-shim-runc-v2; do
	[ -x "$CRI_TOOLS/bin/$b" ] || { echo "demo-k8s: $CRI_TOOLS/bin/$b missing: run make deps" >&2; exit 1; }
done
command -v runc >/dev/null || { echo "demo-k8s: runc missing: run make deps" >&2; exit 1; }
CONTROLLER_TAR=${CRYO_CONTROLLER_IMAGE:-$CRI_BIN/../images/cryo-controller.tar}
[ -f "$CONTROLLER_TAR" ] || { echo "demo-k8s: $CONTROLLER_TAR missing: run make controller-image" >&2; exit 1; }

NODE_IP=10.250.0.1
S3_ADDR=$NODE_IP:9000
BASE_STORE=s3://snapshots/cryo
CGROUP_ROOT=/cryo-demo-k8s

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
now() { date +%s.%N; }
since() { printf '%.1fs' "$(echo "$(now) - $1" | bc)"; }
die() { echo "demo-k8s: $*" >&2; exit 1; }

K8SUP_PID=
# kill_leftovers: the processes that name this demo's directories (shims,
# QEMU, runc's shim), and only those, then the mounts the shims left under
# the state root.
kill_leftovers() {
	[ -n "${CRI_DIR:-}" ] || return 0
	pgrep -f -- "$CRI_DIR/|$CRI_STATE_ROOT/" | xargs -r kill -9 2>/dev/null
	sleep 0.5
	grep " $CRI_STATE_ROOT/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
}
k8s_down() {
	set +e
	if [ -n "$K8SUP_PID" ]; then
		kill "$K8SUP_PID" 2>/dev/null
		wait "$K8SUP_PID" 2>/dev/null
	fi
	# Ctrl-C reaches containerd too: then crictl cannot remove the pods,
	# and their shims and VMs (which containerd started) are ended here.
	kill -0 "${CRI_CONTAINERD_PID:-0}" 2>/dev/null || kill_leftovers
	cri_down
	set +e
	kill_leftovers
	rm -rf "$CRI_STATE_ROOT"
	# The kubelet's cgroups (runc's pods live below CGROUP_ROOT), deepest
	# first, after anything still in them is killed.
	local d
	for d in /sys/fs/cgroup/*"$CGROUP_ROOT" /sys/fs/cgroup"$CGROUP_ROOT"; do
		[ -d "$d" ] || continue
		find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | xargs -r kill -9 2>/dev/null
		find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
	done
}
trap k8s_down EXIT
# A signal ends the script through exit, so that the EXIT trap cleans up.
trap "exit 130" INT TERM

# k: kubectl as the cluster's admin, in the node's network namespace.
k() { nsenter --net="/run/netns/$CRI_NETNS" "$CRI_TOOLS/bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
# run: print a kubectl command line as a user types it, then run it.
run() {
	printf '\033[36m$ kubectl %s\033[0m\n' "$*"
	k "$@"
}
# apply: print the manifest on stdin as a heredoc and kubectl apply it.
apply() {
	local m
	m=$(cat)
	printf '\033[36m$ kubectl apply -f - <<EOF\n%s\nEOF\033[0m\n' "$m"
	printf '%s\n' "$m" | k apply -f -
}
# wait_phase CKPT: until the Checkpoint is Succeeded (or Failed: stop).
wait_phase() {
	local p i
	for i in $(seq 1200); do
		p=$(k get ckpt "$1" -o 'jsonpath={.status.phase}' 2>/dev/null || true)
		case $p in
		Succeeded) return 0 ;;
		Failed) k get ckpt "$1" -o yaml >&2; die "Checkpoint $1 failed" ;;
		esac
		sleep 0.25
	done
	die "Checkpoint $1 not Succeeded after 5 minutes (phase $p)"
}
# The agent: a counter in RAM (tmpfs), one step a second.
AGENT='i=0; while true; do i=$((i+1)); echo $i > /dev/shm/n.new; mv /dev/shm/n.new /dev/shm/n; sleep 1; done'
pod() { # pod NAME [ANNOTATION_KEY ANNOTATION_VALUE]
	cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1${2:+
  annotations:
    $2: $3}
spec:
  runtimeClassName: cryo
  terminationGracePeriodSeconds: 3
  containers:
  - name: agent
    image: $CRI_IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "$AGENT"]
YAML
}
checkpoint() { # checkpoint NAME KEEP_RUNNING
	cat <<YAML
apiVersion: cryo.dev/v1alpha1
kind: Checkpoint
metadata:
  name: $1
spec:
  podName: agent
  keepRunning: $2
YAML
}
state() { k exec "$1" -- sh -c 'echo "counter=$(cat /dev/shm/n) boot=$(cat /proc/sys/kernel/random/boot_id | cut -c1-8)"'; }

say "setup: containerd (handlers cryo and runc), control plane, versitygw, the controller"
t_setup=$(now)
CRI_RUNC=1 CRI_ALLOWED="\"$BASE_STORE/{namespace}/\"" cri_up
(cd "$CRI_ROOT" && go build -o "$CRI_DIR/k8sup" ./hack/k8sup)
"$CRI_DIR/k8sup" -dir "$CRI_DIR" -netns "/run/netns/$CRI_NETNS" -cri-socket "$CRI_DIR/containerd.sock" \
	-node-ip "$NODE_IP" -cgroup-root "$CGROUP_ROOT" -s3-addr "$S3_ADDR" \
	-controller-overlay "$CRI_DIR/overlay" -controller-base "$CRI_ROOT/packaging/kubernetes/controller" \
	-default-store "$BASE_STORE" > "$CRI_DIR/k8sup.env" 2> "$CRI_DIR/k8sup.log" &
K8SUP_PID=$!
until grep -q '^READY=1$' "$CRI_DIR/k8sup.env" 2>/dev/null; do
	kill -0 "$K8SUP_PID" 2>/dev/null || { cat "$CRI_DIR/k8sup.log" >&2; die "the control plane did not start"; }
	sleep 0.5
done
. "$CRI_DIR/k8sup.env"
KUBECONFIG_FILE=$KUBECONFIG
unset KUBECONFIG
echo "node Ready, versitygw on $S3_ENDPOINT, after $(since "$t_setup")"
# The node's S3 store: the shims read cryo.toml when each pod starts.
cat >> "$CRI_DIR/cryo.toml" <<TOML

[stores.s3]
endpoint = "$S3_ENDPOINT"
access_key = "$S3_ACCESS_KEY"
secret_key = "$S3_SECRET_KEY"
region = "us-east-1"
TOML
ctr -a "$CRI_DIR/containerd.sock" -n k8s.io image import --snapshotter overlayfs "$CONTROLLER_TAR" >/dev/null
k apply -f "$CRI_ROOT/packaging/kubernetes/runtimeclass.yaml" >/dev/null
printf 'apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: runc\nhandler: runc\n' | k apply -f - >/dev/null
# Applied, not created: the overlay applies it again.
printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cryo-system\n' | k apply -f - >/dev/null
k -n cryo-system create secret generic cryo-store-credentials \
	--from-literal=STORAGE_S3_ENDPOINT="http://$S3_ENDPOINT" \
	--from-literal=STORAGE_S3_ACCESS_KEY_ID="$S3_ACCESS_KEY" \
	--from-literal=STORAGE_S3_SECRET_ACCESS_KEY="$S3_SECRET_KEY" \
	--from-literal=STORAGE_S3_REGION=us-east-1 >/dev/null
echo "overlay over packaging/kubernetes/controller ($CONTROLLER_OVERLAY):"
sed 's/^/  /' "$CONTROLLER_OVERLAY/deployment-patch.json"
echo
k apply -k "$CONTROLLER_OVERLAY" >/dev/null
k -n cryo-system rollout status deployment/cryo-controller --timeout=300s >/dev/null ||
	{ k -n cryo-system describe pods >&2; die "the controller is not Available"; }
# The webhook answers once its certificate is in place: until then a
# restore from a missing Checkpoint is refused for another reason.
for i in $(seq 240); do
	out=$(pod probe cryo.dev/restore-checkpoint missing-probe | k create --dry-run=server -f - 2>&1 || true)
	case $out in *denied*missing-probe*) break ;; esac
	[ "$i" = 240 ] && die "the webhook does not answer: $out"
	sleep 0.5
done
t_setup=$(since "$t_setup")
echo "controller Available, webhook answering; setup took $t_setup"
# hack/demo-e2b.sh sources this script for its setup (and its cleanup).
[ -z "${DEMO_K8S_SETUP_ONLY:-}" ] || return 0
run get nodes -o wide
run -n cryo-system get deploy,pods -o wide

say "an agent pod under the cryo RuntimeClass"
t0=$(now)
pod agent | apply
run wait --for=condition=Ready pod/agent --timeout=300s
t_cold=$(since "$t0")
run get pod agent -o 'jsonpath={.metadata.annotations.cryo\.dev/checkpoint-to}{"\n"}'
echo "(the controller's webhook set the pod's checkpoint target)"
sleep 3
echo "agent: $(state agent)"

say "hibernate: a Checkpoint with keepRunning: false"
echo "agent: $(state agent)"
t0=$(now)
checkpoint nap false | apply
wait_phase nap
# (kubectl wait --for=delete of a pod already gone fails on older kubectl)
run wait --for=delete pod/agent --timeout=120s 2>/dev/null || ! k get pod agent >/dev/null 2>&1 || die "pod agent not deleted"
t_hibernate=$(since "$t0")
run get ckpt nap
run get pods
echo "hibernated (Succeeded and the pod gone) in $t_hibernate"

say "resume: the pod again, with cryo.dev/restore-checkpoint: nap"
t0=$(now)
pod agent cryo.dev/restore-checkpoint nap | apply
run wait --for=condition=Ready pod/agent --timeout=300s
t_ready=$(since "$t0")
s=$(state agent)
t_exec=$(since "$t0")
run get pod agent -o 'jsonpath={.metadata.annotations.cryo\.dev/restore-from}{"\n"}'
echo "agent: $s"
echo "(the counter goes on from where it was at the Checkpoint: the same guest, boot id and all, resumed from its RAM)"
echo "resumed: Ready after $t_ready, first exec after $t_exec (cold boot was $t_cold)"

say "fork: a Checkpoint with keepRunning: true, then three pods from it"
t0=$(now)
checkpoint warm true | apply
wait_phase warm
t_ckpt=$(since "$t0")
echo "checkpoint Succeeded in $t_ckpt; agent still runs: $(state agent)"
t0=$(now)
for n in 1 2 3; do pod "fork-$n" cryo.dev/restore-checkpoint warm; echo ---; done | sed '$d' | apply
run wait --for=condition=Ready pod/fork-1 pod/fork-2 pod/fork-3 --timeout=300s
t_fork=$(since "$t0")
run get pods -o wide
for n in 1 2 3; do echo "fork-$n: $(state "fork-$n")"; done
echo "three forks Ready in $t_fork (each its own pod and IP, the same RAM)"
run get ckpt -o wide

say "delete a Checkpoint: its finalizer removes its store tag"
ls_tags() { nsenter --net="/run/netns/$CRI_NETNS" "$CRI_BIN/cryoctl" --config "$CRI_DIR/cryo.toml" ls "$BASE_STORE/default/pods"; }
echo "the node's view of the store (cryoctl ls $BASE_STORE/default/pods), before; nap's tag is cp-$(k get ckpt nap -o 'jsonpath={.metadata.uid}'):"
ls_tags | sed 's/^/  /'
run delete ckpt nap --timeout=120s
echo "after:"
ls_tags | sed 's/^/  /'
run get ckpt

say "times"
printf '  setup: containerd, cluster, controller %s\n' "$t_setup"
printf '  cold boot to Ready                      %s\n' "$t_cold"
printf '  hibernate: apply -> Succeeded, pod gone  %s\n' "$t_hibernate"
printf '  resume: create -> Ready                  %s\n' "$t_ready"
printf '  resume: create -> first exec             %s\n' "$t_exec"
printf '  checkpoint, keepRunning: true            %s\n' "$t_ckpt"
printf '  fork: 3 pods created -> all Ready        %s\n' "$t_fork"
say "done (removing everything)"
