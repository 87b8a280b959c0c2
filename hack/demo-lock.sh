# Sourced first by every demo script (demo.sh, demo-cri.sh, and through it
# demo-k8s.sh and demo-e2b.sh). A demo uses fixed names (its state roots,
# its network namespace), so one runs on a machine at a time: the entry
# script runs again under /run/lock/cryo-demo.lock, held by flock itself
# (-o: the demo's containerd, shims and VMs do not inherit it, so a killed
# demo's leftovers never hold it), and a second demo is refused. Under the
# lock whatever a killed earlier demo left is cleared first
# (hack/ci-clean.sh demo): its processes, mounts, network namespace and
# directories would fail this one.
if [ -z "${CRYO_DEMO_LOCKED:-}" ]; then
	export CRYO_DEMO_LOCKED=1
	demo_rc=0
	mkdir -p /run/lock
	flock -n -o -E 75 /run/lock/cryo-demo.lock bash "$0" "$@" || demo_rc=$?
	[ "$demo_rc" = 75 ] && echo "demo: another demo runs on this machine (it holds /run/lock/cryo-demo.lock)" >&2
	exit "$demo_rc"
fi
"$(dirname "${BASH_SOURCE[0]}")/ci-clean.sh" demo
