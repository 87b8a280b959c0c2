#!/usr/bin/env bash
# The E2B demo: an unmodified E2B SDK script (hack/demo-e2b.mjs, npm e2b)
# drives an agent's sandbox on cryo with only E2B_API_URL, E2B_SANDBOX_URL
# and E2B_API_KEY set: create, write its state and start a counter, pause,
# resume, read the state back, fork it into two; each step timed.
#
# Setup: hack/demo-k8s.sh's (containerd with cryo, a one-node cluster,
# versitygw, the controller from packaging/kubernetes/controller with the
# E2B API on :3000 and the sandbox gateway on :3001), then an E2B template
# image (busybox with a /bin/bash, hack/mkimage -e2b-template) as the
# controller's template "base", and an API key Secret for namespace default.
# Everything is removed at the end, as demo-k8s.sh removes it.
# Needs: `make deps build controller-image` (and Node.js; the SDK is
# installed by hack/tools.sh e2b-sdk); run as root.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v node >/dev/null || { echo "demo-e2b: node missing: install Node.js 18 or later" >&2; exit 1; }
E2B_SDK_VERSION=$(sed -n 's/^const E2BSDKVersion = "\(.*\)"$/\1/p' "$HERE/../integration/harness/e2b.go")
E2B_SDK_DIR=${CRYO_TOOLS:-/var/cache/cryo/tools}/e2b-sdk@$E2B_SDK_VERSION
[ -d "$E2B_SDK_DIR/node_modules/e2b" ] || "$HERE/tools.sh" e2b-sdk

DEMO_K8S_SETUP_ONLY=1
. "$HERE/demo-k8s.sh"

TEMPLATE_IMAGE=cryo.local/e2b-base:1
API_KEY=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')

say "the E2B side: a template image, the controller's template base, an API key"
(cd "$CRI_ROOT" && go run ./hack/mkimage -e2b-template "$CRI_DIR/e2b-base.tar" "$TEMPLATE_IMAGE" sleep inf)
ctr -a "$CRI_DIR/containerd.sock" -n k8s.io image import "$CRI_DIR/e2b-base.tar" >/dev/null
run -n cryo-system patch deployment cryo-controller --type=json \
	-p "[{\"op\":\"add\",\"path\":\"/spec/template/spec/containers/0/args/-\",\"value\":\"--e2b-templates=base=$TEMPLATE_IMAGE\"}]"
k -n cryo-system rollout status deployment/cryo-controller --timeout=300s >/dev/null ||
	{ k -n cryo-system describe pods >&2; die "the controller is not Available"; }
run -n cryo-system create secret generic demo-key --from-literal=apiKey="$API_KEY"
run -n cryo-system label secret demo-key cryo.dev/e2b-api-key="$(printf %s "$API_KEY" | sha256sum | cut -c1-63)"
run -n cryo-system annotate secret demo-key cryo.dev/e2b-namespace=default
CONTROLLER_IP=$(k -n cryo-system get pods -l app.kubernetes.io/name=cryo-controller \
	--field-selector=status.phase=Running -o 'jsonpath={.items[0].status.podIP}')
[ -n "$CONTROLLER_IP" ] || die "the controller's pod has no address"

say "the agent: hack/demo-e2b.mjs with the E2B SDK $E2B_SDK_VERSION"
export E2B_API_URL=http://$CONTROLLER_IP:3000 E2B_SANDBOX_URL=http://$CONTROLLER_IP:3001 E2B_API_KEY=$API_KEY
printf '\033[36m$ E2B_API_URL=%s E2B_SANDBOX_URL=%s E2B_API_KEY=... node hack/demo-e2b.mjs\033[0m\n' "$E2B_API_URL" "$E2B_SANDBOX_URL"
nsenter --net="/run/netns/$CRI_NETNS" env E2B_SDK_DIR="$E2B_SDK_DIR" node "$HERE/demo-e2b.mjs" ||
	{ k -n cryo-system logs -l app.kubernetes.io/name=cryo-controller --tail=40 >&2; die "the agent script failed"; }
run get pods,checkpoints -l cryo.dev/e2b-sandbox -o wide
say "done (removing everything)"
