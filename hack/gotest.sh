#!/usr/bin/env bash
# Runs `go test` with the arguments given, keeps its whole output in
# $CRYO_TEST_LOG (default _output/test.log), and, when it fails, ends with a
# summary of what failed: CI shows only a run's last lines, and the failing
# test's name is often thousands of lines above them.
set -uo pipefail
log=${CRYO_TEST_LOG:-_output/test.log}
mkdir -p "$(dirname "$log")"
go test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
	echo
	echo "==== go test failed (exit $rc); full output: $log"
	grep -E '^(\s*--- FAIL:|FAIL\s|panic:|# |.*\[build failed\]|.*\[setup failed\])' "$log" | grep -v '^ok' | tail -40
	echo "==== failed tests: $(grep -cE '^\s*--- FAIL:' "$log")"
fi
exit "$rc"
