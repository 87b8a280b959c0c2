#!/usr/bin/env bash
# The Kubernetes demo: the CRI demo's private containerd (hack/demo-cri.sh's
# cri_up: CRI, the cryo handler, a CNI bridge in its own network namespace)
# with a one-node control plane on it (hack/k8sup: etcd, kube-apiserver,
# kubelet, built by `make deps`), then through kubectl and the kubelet:
#   the RuntimeClass from packaging/kubernetes, a pod with runtimeClassName
#   cryo, kubectl logs and exec, a checkpoint through the kubelet's API into
#   the store its cryo.dev/checkpoint-to names, a second pod restored with
#   cryo.dev/restore-from that continues the first one's RAM state, and how
#   long each pod took to become Ready.
# Everything is removed at the end (also on failure), and the host's
# sysctls and paths that the kubelet changes are put back.
# Needs: `make build deps`; run as root.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/demo-cri.sh"
for b in kube-apiserver kubelet kubectl etcd; do
	[ -x "$CRI_TOOLS/bin/$b" ] || { echo "demo-k8s: $CRI_TOOLS/bin/$b missing: run make deps" >&2; exit 1; }
done
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
now() { date +%s.%N; }
since() { printf '%.1fs' "$(echo "$(now) - $1" | bc)"; }
K8SUP_PID=
k8s_down() {
	set +e
	if [ -n "$K8SUP_PID" ]; then kill "$K8SUP_PID" 2>/dev/null; wait "$K8SUP_PID" 2>/dev/null; fi
	cri_down
}
trap k8s_down EXIT

say "start a private containerd with CRI and the cryo runtime handler"
cri_up
say "start etcd, kube-apiserver and a kubelet on it (same network namespace; node cryo-node)"
(cd "$CRI_ROOT" && go build -o "$CRI_DIR/k8sup" ./hack/k8sup)
t0=$(now)
"$CRI_DIR/k8sup" -dir "$CRI_DIR" -netns "/run/netns/$CRI_NETNS" -cri-socket "$CRI_DIR/containerd.sock" > "$CRI_DIR/k8sup.out" &
K8SUP_PID=$!
while [ ! -s "$CRI_DIR/k8sup.out" ]; do
	kill -0 "$K8SUP_PID" 2>/dev/null || { echo "demo-k8s: the control plane did not start" >&2; exit 1; }
	sleep 0.5
done
KUBECONFIG_FILE=$(head -1 "$CRI_DIR/k8sup.out")
k() { nsenter --net="/run/netns/$CRI_NETNS" "$CRI_TOOLS/bin/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
echo "node Ready after $(since "$t0")"
k get nodes -o wide

say "RuntimeClass cryo (packaging/kubernetes/runtimeclass.yaml)"
k apply -f "$CRI_ROOT/packaging/kubernetes/runtimeclass.yaml"

pod() { # pod NAME ANNOTATION_KEY ANNOTATION_VALUE SCRIPT
	cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  annotations: {"$2": "$3"}
spec:
  nodeName: cryo-node
  runtimeClassName: cryo
  restartPolicy: Never
  terminationGracePeriodSeconds: 3
  containers:
  - name: agent
    image: $CRI_IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "$4"]
YAML
}
STORE="file://$CRI_DIR/store/agent:v1"
say "pod agent: runtimeClassName cryo, cryo.dev/checkpoint-to $STORE"
t0=$(now)
pod agent cryo.dev/checkpoint-to "$STORE" 'echo hello from $(hostname), kernel $(uname -r); i=0; while true; do i=$((i+1)); echo $i > /dev/shm/n.new; mv /dev/shm/n.new /dev/shm/n; echo counter $i; sleep 1; done' | k apply -f -
k wait --for=condition=Ready pod/agent --timeout=300s >/dev/null
t_cold=$(since "$t0")
k get pod agent -o wide
for i in $(seq 50); do k logs agent 2>/dev/null | grep -q "counter 3" && break; sleep 0.2; done

say "kubectl logs / exec (API server -> kubelet -> containerd's streaming server -> guest)"
k logs agent | head -4
k exec agent -- sh -c 'echo "exec: counter=$(cat /dev/shm/n) kernel=$(uname -r) hostname=$(hostname) cpus=$(nproc)"'

say "checkpoint through the kubelet's API: POST https://10.250.0.1:10250/checkpoint/default/agent/agent"
t0=$(now)
nsenter --net="/run/netns/$CRI_NETNS" curl -fsSk -X POST "https://10.250.0.1:10250/checkpoint/default/agent/agent?timeout=300"; echo
echo "checkpoint took $(since "$t0"); counter now $(k exec agent -- cat /dev/shm/n)"
cryoctl --config "$CRI_DIR/cryo.toml" inspect "$STORE" | sed -n '1,4p'

say "pod agent-restored: cryo.dev/restore-from $STORE"
t0=$(now)
pod agent-restored cryo.dev/restore-from "$STORE" 'echo this never runs: the restored VM continues the checkpointed workload' | k apply -f -
k wait --for=condition=Ready pod/agent-restored --timeout=300s >/dev/null
t_restored=$(since "$t0")
sleep 2
k get pods -o wide
echo "restored: $(k exec agent-restored -- sh -c 'echo counter=$(cat /dev/shm/n) hostname=$(hostname) boot=$(cat /proc/sys/kernel/random/boot_id)')"
echo "source:   $(k exec agent -- sh -c 'echo counter=$(cat /dev/shm/n) hostname=$(hostname) boot=$(cat /proc/sys/kernel/random/boot_id)')"
echo "(same guest boot id: the restored pod runs on from the source's RAM, under its own name and IP)"
echo "Ready after: cold boot $t_cold, restored $t_restored"

say "kubectl delete"
k delete pod agent agent-restored --timeout=120s
say "done"
