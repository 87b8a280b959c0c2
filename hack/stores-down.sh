#!/usr/bin/env bash
# Stops the servers hack/stores-up.sh started (by their pid files) and,
# with --purge, removes their data.
set -euo pipefail
DIR=${CRYO_STORES_DIR:-/tmp/cryo-stores}
for name in s3 registry; do
	pidf="$DIR/$name.pid"
	[ -f "$pidf" ] || continue
	pid=$(cat "$pidf")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	rm -f "$pidf"
done
if [ "${1:-}" = "--purge" ]; then rm -rf "$DIR"; fi
echo "stores: stopped"
