#!/usr/bin/env bash
# What `make test` and CI (.ci/run) run, in timed phases:
#
#   deps         make deps (hack/deps.sh all)
#   build        make build controller-image
#   vet          gofmt, go vet with and without the integration tag
#   unit         the packages with no file under the integration tag, in parallel
#   integration  the packages with such files (QEMU, containerd, Kubernetes), one
#                package at a time, the integration package's tests in lanes (below)
#
# A failing deps, build or vet phase ends the run; a failing unit phase does not
# stop the integration phase. gotestsum runs the tests and writes every test
# event to $OUT/test/<phase>.json; the whole output is in $OUT/test/test.log.
# The run ends with the 15 slowest tests, the wall time of each phase and,
# last, what failed, one `FAIL <package> <Test>` line each (hack/testsummary):
# CI shows only a run's tail, and a failing test's log is often thousands of
# lines above it.
#
# usage: hack/test.sh [go test flag...]     e.g. hack/test.sh -run '^TestRunEcho$'
#   TESTFLAGS  more go test flags, split at blanks (make test TESTFLAGS=...)
#   TESTPKGS   the packages (default ./...)
#   LANES      1: the integration package's tests one at a time, in one go
#              test run (as with a -run or -skip flag); by default in lanes
set -uo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$self")/.."
OUT=${OUT:-$PWD/_output}
dir=$OUT/test

# Everything, the summary included, goes to the log as well.
if [ -z "${CRYO_TEST_TEED:-}" ]; then
	mkdir -p "$dir"
	rm -f "$dir"/*.json "$dir/test.log" "$dir/lanes"
	CRYO_TEST_TEED=1 "$self" "$@" 2>&1 | tee "$dir/test.log"
	exit "${PIPESTATUS[0]}"
fi
unset CRYO_TEST_TEED

MAKE=${MAKE:-make}
LANES=${LANES:-}
TESTPKGS=${TESTPKGS:-./...}
read -ra extra <<<"${TESTFLAGS:-}"
goflags=(-tags integration -count=1 -timeout 75m "${extra[@]}" "$@")
names=() secs=() codes=() jsons=()
rc=0

# phase NAME CMD...: runs one timed phase and records how it ended.
phase() {
	local name=$1 start=$SECONDS code
	shift
	echo "==== $name: $*"
	"$@"
	code=$?
	names+=("$name") secs+=($((SECONDS - start))) codes+=("$code")
	[ "$code" -eq 0 ] || [ "$rc" -ne 0 ] || rc=$code
	return "$code"
}

vet() {
	local unformatted
	unformatted=$(gofmt -l .)
	if [ -n "$unformatted" ]; then
		echo "gofmt needed:"
		echo "$unformatted"
		return 1
	fi
	go vet ./... && go vet -tags integration ./...
}

# integration_packages: those whose files differ under the integration tag.
# Without the tag, go list -e still names a package whose every file is
# tagged (integration/), with no files.
integration_packages() {
	local f='{{.ImportPath}} {{.GoFiles}} {{.TestGoFiles}} {{.XTestGoFiles}}'
	# shellcheck disable=SC2086 # TESTPKGS is a list of patterns
	comm -13 <(go list -e -f "$f" $TESTPKGS | sort) \
		<(go list -e -tags integration -f "$f" $TESTPKGS | sort) | cut -d' ' -f1
}

# gotestsum_phase NAME GO-TEST-ARG...: one line per test, a failed test's log
# when it fails (--format testname), and gotestsum's summary without the logs
# at the end of the phase; the summary of all phases comes from report.
gotestsum_phase() {
	local name=$1
	shift
	jsons+=("$dir/$name.json")
	gotestsum --format testname --format-hide-empty-pkg --hide-summary=output \
		--jsonfile "$dir/$name.json" -- "$@"
}

# The integration package's tests run in lanes: concurrent go test runs of
# disjoint sets of them. Most of such a test's time is waiting (for a guest
# under TCG, a kubelet's sync loop, a Checkpoint's backoff), so two cores
# carry three lanes: one test at a time took 33 min, three lanes 15 min,
# the cores busy throughout (docs/testing.md). Every test has its own containerd, network namespace and
# state either way, and a test that starts a Kubernetes control plane holds
# stack.HostLock (the kubelet's host paths and sysctls are global), so a
# lane list that is out of date is slower, never wrong. A lane is a name and
# a -run pattern of the integration package; the last lane, "node", runs the
# other tests and the other integration packages.
lanes=(
	"k8s ^(TestK8s|TestK8sCheckpoints|TestE2BSandbox|TestE2BGateway|TestE2BControlPlane|TestControllerDeploys|TestClusterStore)$"
	"cri ^(TestContainerdCRISuite|TestCritest|TestKillDeleteNeverHangs|TestCRIStartTime|TestCRIPodSizing|TestCRICheckpointRestore)$"
)

# integration PACKAGE...: the integration phase, in lanes when the
# integration package is among the packages and no flag chooses tests.
integration() {
	local name pattern skip="" pids=() code=0 p
	if [ "$LANES" = 1 ] || ! printf '%s\n' "$@" | grep -q '/integration$' ||
		printf '%s\n' "${goflags[@]}" | grep -qE '^-(test\.)?(run|skip)(=|$)'; then
		gotestsum_phase integration -p 1 "${goflags[@]}" "$@"
		return
	fi
	for l in "${lanes[@]}"; do
		read -r name pattern <<<"$l"
		skip+="${skip:+|}$pattern"
		jsons+=("$dir/integration-$name.json")
		lane "$name" "${goflags[@]}" -run "$pattern" "$(printf '%s\n' "$@" | grep '/integration$')" &
		pids+=($!)
	done
	jsons+=("$dir/integration-node.json")
	lane node -p 1 "${goflags[@]}" -skip "$skip" "$@" &
	pids+=($!)
	for p in "${pids[@]}"; do
		wait "$p" || code=$?
	done
	return "$code"
}

# lane NAME GO-TEST-ARG...: one lane, its lines prefixed with its name, its
# wall time kept for the report.
lane() {
	local name=$1 start=$SECONDS code
	shift
	# In the background: gotestsum_phase's jsons+= is the caller's to do.
	gotestsum_phase "integration-$name" "$@" 2>&1 | sed -u "s/^/[$name] /"
	code=${PIPESTATUS[0]}
	echo "$name $((SECONDS - start)) $code" >>"$dir/lanes"
	return "$code"
}

duration() {
	if [ "$1" -ge 60 ]; then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi
}

report() {
	local i f written=() where="the whole output: ${dir#"$PWD"/}/test.log; the test events: ${dir#"$PWD"/}/<phase>.json"
	# A phase whose gotestsum did not start wrote none.
	for f in "${jsons[@]}"; do [ ! -f "$f" ] || written+=("$f"); done
	echo
	if [ ${#written[@]} -gt 0 ]; then
		echo "==== the 15 slowest tests"
		# --num would list tests under the threshold too.
		gotestsum tool slowest --threshold 1s --jsonfile <(cat "${written[@]}") | head -n 15
	fi
	echo "==== wall time per phase"
	for i in "${!names[@]}"; do
		printf '%-12s %9s\n' "${names[$i]}" "$(duration "${secs[$i]}")"
	done
	if [ -f "$dir/lanes" ]; then
		while read -r lname lsecs lcode; do
			printf '  lane %-7s %9s%s\n' "$lname" "$(duration "$lsecs")" "$([ "$lcode" -eq 0 ] || echo " (exit $lcode)")"
		done <"$dir/lanes"
	fi
	printf '%-12s %9s\n' total "$(duration "$SECONDS")"
	if [ "$rc" -eq 0 ]; then
		echo "==== passed ($where)"
	else
		echo "==== failed ($where)"
	fi
	for i in "${!names[@]}"; do
		[ "${codes[$i]}" -eq 0 ] || echo "FAIL phase ${names[$i]} (exit ${codes[$i]})"
	done
	[ ${#written[@]} -eq 0 ] || go run ./hack/testsummary "${written[@]}"
}

run() {
	phase deps "$MAKE" deps || return
	phase build "$MAKE" build controller-image || return
	phase vet vet || return
	local ipkgs upkgs
	ipkgs=$(integration_packages)
	# shellcheck disable=SC2086 # TESTPKGS is a list of patterns
	upkgs=$(go list -e -tags integration $TESTPKGS | grep -vxF "$ipkgs")
	# shellcheck disable=SC2086 # package lists
	[ -z "$upkgs" ] || phase unit gotestsum_phase unit "${goflags[@]}" $upkgs
	# shellcheck disable=SC2086
	[ -z "$ipkgs" ] || phase integration integration $ipkgs
}

run
report
exit "$rc"
