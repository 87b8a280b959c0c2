#!/usr/bin/env bash
# Starts a local S3 server (versitygw) and an OCI registry (distribution) on
# 127.0.0.1 for manual tests of cryoctl and the stores, and writes an env
# file with the STORAGE_S3_* settings. The Go tests start their own servers
# (stores/storetest); this script is for humans and demos.
#   hack/stores-up.sh          # then: . $CRYO_STORES_DIR/env
#   hack/stores-down.sh
set -euo pipefail
CRYO_TOOLS=${CRYO_TOOLS:-/var/cache/cryo/tools}
DIR=${CRYO_STORES_DIR:-/tmp/cryo-stores}
S3_PORT=${S3_PORT:-9000}
REGISTRY_PORT=${REGISTRY_PORT:-5000}
BUCKET=${BUCKET:-snapshots}
ACCESS=${STORAGE_S3_ACCESS_KEY_ID:-cryo}
SECRET=${STORAGE_S3_SECRET_ACCESS_KEY:-cryo-secret-key}

tool() {
	local p="$CRYO_TOOLS/bin/$1"
	[ -x "$p" ] || p=$(command -v "$1" || true)
	[ -n "$p" ] || { echo "stores: $1 not found: run \`make tools\` (or hack/tools.sh $1)" >&2; exit 1; }
	echo "$p"
}
versitygw=$(tool versitygw)
registry=$(tool registry)

mkdir -p "$DIR/s3/$BUCKET" "$DIR/registry"
chmod 700 "$DIR"
if [ -f "$DIR/s3.pid" ] && kill -0 "$(cat "$DIR/s3.pid")" 2>/dev/null; then
	echo "stores: already running (hack/stores-down.sh first)" >&2
	exit 1
fi

"$versitygw" --access "$ACCESS" --secret "$SECRET" --port "127.0.0.1:$S3_PORT" --quiet \
	posix "$DIR/s3" >"$DIR/s3.log" 2>&1 &
echo $! >"$DIR/s3.pid"

cat >"$DIR/registry.yml" <<YAML
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $DIR/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$REGISTRY_PORT
YAML
OTEL_TRACES_EXPORTER=none "$registry" serve "$DIR/registry.yml" >"$DIR/registry.log" 2>&1 &
echo $! >"$DIR/registry.pid"

for _ in $(seq 100); do
	if curl -fsS "http://127.0.0.1:$REGISTRY_PORT/v2/" >/dev/null 2>&1 &&
		curl -sS -o /dev/null "http://127.0.0.1:$S3_PORT/" 2>/dev/null; then
		break
	fi
	sleep 0.1
done

umask 077
cat >"$DIR/env" <<ENV
export STORAGE_S3_ENDPOINT=127.0.0.1:$S3_PORT
export STORAGE_S3_ACCESS_KEY_ID=$ACCESS
export STORAGE_S3_SECRET_ACCESS_KEY=$SECRET
export STORAGE_S3_BUCKET_NAME=$BUCKET
export STORAGE_S3_USE_SSL=false
export STORAGE_S3_REGION=us-east-1
export CRYO_REGISTRY=127.0.0.1:$REGISTRY_PORT
ENV
echo "stores: S3 at 127.0.0.1:$S3_PORT (bucket $BUCKET), registry at 127.0.0.1:$REGISTRY_PORT"
echo "stores: . $DIR/env   then e.g. cryoctl ls s3://$BUCKET/name  /  cryoctl ls oci://127.0.0.1:$REGISTRY_PORT/repo"
