#!/usr/bin/env bash
# Clears what earlier runs left on this machine when they were killed
# mid-run (a CI job or a work session that ended under them, a demo killed
# with SIGKILL): their QEMU, containerd, shim and Kubernetes processes, their
# mounts, cgroups, network namespaces and CNI results, and their
# directories.
#
#   hack/ci-clean.sh         the tests' and the bench's: what a test or bench
#                            stack names (cryo-it-*, cryo-bench-*, cryo-cri-*),
#                            the loopback shaping of stack.Shape, every
#                            pagefs mount, and the etcd and kube-apiserver of
#                            the envtest unit tests (k8s_test_framework_*).
#                            CI runs it before the tests: their leak checks
#                            would count another run's leftovers
#                            (TestBenchQuick looks for /dev/shm/cryo-bench-*),
#                            and Shape refuses a loopback already shaped.
#   hack/ci-clean.sh demo    the demos' (cryo-demo*): each demo runs it under
#                            the demo lock before it starts (hack/demo-lock.sh),
#                            so a killed demo does not fail the next one.
set -uo pipefail

case ${1:-tests} in
tests)
	proc_re='/(tmp|run|dev/shm)/cryo-(it|bench)[-/]|/tmp/k8s_test_framework_[0-9]'
	mount_re='^/(tmp|run)/cryo-(it|bench)[-/]'
	all_pagefs=1 shaping=1
	cgroups=(/sys/fs/cgroup/*/cryo-it-* /sys/fs/cgroup/*/cryo-bench-*)
	netns_re='^cryo-cri-'
	cni=cryo-cri
	dirs=(/tmp/k8s_test_framework_* /tmp/cryo-it-* /tmp/cryo-bench-* /run/cryo-it /run/cryo-bench /dev/shm/cryo-it-* /dev/shm/cryo-bench-* /var/lib/cni/networks/cryo-cri-*)
	;;
demo)
	# hack/demo.sh's /tmp/cryo-demo.XXXX, /run/cryo-demo and
	# /dev/shm/cryo-demo.XXXX; hack/demo-cri.sh's (and demo-k8s.sh's and
	# demo-e2b.sh's) the same with cryo-demo-cri. Not /run/lock/cryo-demo.lock.
	proc_re='/(tmp|run|dev/shm)/cryo-demo(-cri)?[./]'
	mount_re='^/(tmp|run)/cryo-demo(-cri)?[./]'
	all_pagefs=0 shaping=0
	cgroups=(/sys/fs/cgroup/*/cryo-demo-k8s)
	netns_re='^cryo-demo-cri$'
	cni=cryo-demo
	dirs=(/tmp/cryo-demo.* /tmp/cryo-demo-cri.* /run/cryo-demo /run/cryo-demo-cri /dev/shm/cryo-demo.* /dev/shm/cryo-demo-cri.*)
	;;
*)
	echo "usage: $0 [tests|demo]" >&2
	exit 2
	;;
esac
me=$(basename "$0")

# Processes first: a live QEMU keeps its files and mounts busy.
for p in /proc/[0-9]*; do
	pid=${p#/proc/}
	[ "$pid" = "$$" ] && continue
	cl=$( { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
	if [[ $cl =~ $proc_re ]]; then
		echo "$me: killing $pid: ${cl:0:160}" >&2
		kill -9 "$pid" 2>/dev/null
	fi
done
sleep 1

# The pods of runtimes with cgroups (runc) a stack's kubelet ran, in its
# cgroup root (Stack.CgroupRoot, named after the stack's directory; the
# Kubernetes demo's CGROUP_ROOT): their processes first, then the cgroups,
# deepest first.
for cg in "${cgroups[@]}"; do
	[ -d "$cg" ] || continue
	find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
		echo "$me: killing $pid in $cg" >&2
		kill -9 "$pid" 2>/dev/null
	done
done
sleep 1
for cg in "${cgroups[@]}"; do
	[ -d "$cg" ] || continue
	echo "$me: removing cgroup $cg" >&2
	find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
done

# Mounts under the runs' directories, and (tests) the lazy restores' page
# servers, deepest first.
awk '{print $2, $3}' /proc/self/mounts | while read -r mnt fstype; do
	mnt=$(printf '%b' "$mnt")
	if [[ $mnt =~ $mount_re ]] || { [ "$all_pagefs" = 1 ] && [[ $fstype == *cryo-pagefs* ]]; }; then
		echo "$mnt"
	fi
done | sort -r | while read -r mnt; do
	echo "$me: unmounting $mnt" >&2
	umount -l "$mnt" 2>/dev/null
done

# stack.Shape's loopback shaping (an htb root with its store class 1:20).
if [ "$shaping" = 1 ] && tc qdisc show dev lo 2>/dev/null | grep -q '^qdisc htb 1: root' &&
	tc class show dev lo classid 1:20 2>/dev/null | grep -q 'class htb 1:20'; then
	echo "$me: removing the loopback shaping a killed run left" >&2
	tc qdisc del dev lo root
fi

# A CRI stack's (harness.CRI NetNSName) or the CRI demo's network
# namespace, with its bridge in it.
for n in $(ip netns list 2>/dev/null | awk -v re="$netns_re" '$1 ~ re {print $1}'); do
	echo "$me: removing network namespace $n" >&2
	ip netns del "$n"
done

# host-local's leases of the CRI suite's pods (harness.CRI IPAMDir) and
# libcni's results of a CRI stack's pods are named after the stack's CNI
# network, its network namespace's name (cryo-cri-*-<pod id>-eth0; the
# demo's cryo-demo-<pod id>-eth0); the loopback network's result of the same
# pod only by the pod's id. The task FIFOs are in the runs' directories.
for f in /var/lib/cni/results/"$cni"-*; do
	[ -e "$f" ] || continue
	id=${f%-*}
	lo=/var/lib/cni/results/cni-loopback-${id##*-}-lo
	[ -e "$lo" ] || continue
	echo "$me: removing $lo" >&2
	rm -f "$lo"
done
for d in "${dirs[@]}" /var/lib/cni/results/"$cni"-*; do
	[ -e "$d" ] || continue
	echo "$me: removing $d" >&2
	rm -rf "$d"
done
exit 0
