#!/usr/bin/env bash
# Clears what earlier runs of cryo's tests and bench left on this machine
# when they were killed mid-run (a CI job or a work session that ended
# under them): their QEMU, containerd and shim processes, their mounts, the
# loopback shaping of stack.Shape, the etcd and kube-apiserver of the
# controller's and the E2B API's envtest unit tests, and their directories.
# CI runs it before the tests: their leak checks would count another run's
# leftovers (TestBenchQuick looks for /dev/shm/cryo-bench-*), and Shape
# refuses a loopback that is already shaped. It touches only what a test or
# bench stack names (cryo-it-*, cryo-bench-*, cryo-cri-*), what Shape makes
# and what envtest names (k8s_test_framework_*).
set -uo pipefail

stack_re='/(tmp|run|dev/shm)/cryo-(it|bench)[-/]|/tmp/k8s_test_framework_[0-9]'

# Processes first: a live QEMU keeps its files and mounts busy.
for p in /proc/[0-9]*; do
	pid=${p#/proc/}
	[ "$pid" = "$$" ] && continue
	cl=$( { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
	if [[ $cl =~ $stack_re ]]; then
		echo "ci-clean: killing $pid: ${cl:0:160}" >&2
		kill -9 "$pid" 2>/dev/null
	fi
done
sleep 1

# The pods of runtimes with cgroups (runc) a stack's kubelet ran, in its
# cgroup root (Stack.CgroupRoot, named after the stack's directory): their
# processes first, then the cgroups, deepest first.
for cg in /sys/fs/cgroup/*/cryo-it-* /sys/fs/cgroup/*/cryo-bench-*; do
	[ -d "$cg" ] || continue
	find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
		echo "ci-clean: killing $pid in $cg" >&2
		kill -9 "$pid" 2>/dev/null
	done
done
sleep 1
for cg in /sys/fs/cgroup/*/cryo-it-* /sys/fs/cgroup/*/cryo-bench-*; do
	[ -d "$cg" ] || continue
	echo "ci-clean: removing cgroup $cg" >&2
	find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
done

# Mounts under a stack's directories, and the lazy restores' page servers,
# deepest first.
awk '{print $2, $3}' /proc/self/mounts | while read -r mnt fstype; do
	mnt=$(printf '%b' "$mnt")
	if [[ $mnt =~ ^/(tmp|run)/cryo-(it|bench)[-/] ]] || [[ $fstype == *cryo-pagefs* ]]; then
		echo "$mnt"
	fi
done | sort -r | while read -r mnt; do
	echo "ci-clean: unmounting $mnt" >&2
	umount -l "$mnt" 2>/dev/null
done

# stack.Shape's loopback shaping (an htb root with its store class 1:20).
if tc qdisc show dev lo 2>/dev/null | grep -q '^qdisc htb 1: root' &&
	tc class show dev lo classid 1:20 2>/dev/null | grep -q 'class htb 1:20'; then
	echo "ci-clean: removing the loopback shaping a killed run left" >&2
	tc qdisc del dev lo root
fi

# A CRI stack's network namespace (harness.CRI NetNSName), with its
# bridge in it.
for n in $(ip netns list 2>/dev/null | awk '$1 ~ /^cryo-cri-/ {print $1}'); do
	echo "ci-clean: removing network namespace $n" >&2
	ip netns del "$n"
done

# host-local's leases of the CRI suite's pods (harness.CRI IPAMDir) and
# libcni's results of a CRI stack's pods are named after the stack's CNI
# network, its network namespace's name (cryo-cri-*-<pod id>-eth0); the
# loopback network's result of the same pod only by the pod's id. The
# stacks' task FIFOs are in their directories.
for f in /var/lib/cni/results/cryo-cri-*; do
	[ -e "$f" ] || continue
	id=${f%-*}
	lo=/var/lib/cni/results/cni-loopback-${id##*-}-lo
	[ -e "$lo" ] || continue
	echo "ci-clean: removing $lo" >&2
	rm -f "$lo"
done
for d in /tmp/k8s_test_framework_* /tmp/cryo-it-* /tmp/cryo-bench-* /run/cryo-it /run/cryo-bench /dev/shm/cryo-it-* /dev/shm/cryo-bench-* /var/lib/cni/networks/cryo-cri-* /var/lib/cni/results/cryo-cri-*; do
	[ -e "$d" ] || continue
	echo "ci-clean: removing $d" >&2
	rm -rf "$d"
done
exit 0
