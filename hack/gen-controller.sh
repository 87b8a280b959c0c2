#!/bin/sh
# Regenerates api/v1alpha1/zz_generated.deepcopy.go and the Checkpoint CRD
# (packaging/kubernetes/controller/crd.yaml) with controller-gen, pinned in
# the module hack/controller-gen. Run after changing api/v1alpha1.
set -eu
cd "$(dirname "$0")/.."
bin=${CONTROLLER_GEN:-$PWD/_output/tools/controller-gen}
if [ ! -x "$bin" ]; then
	mkdir -p "$(dirname "$bin")"
	(cd hack/controller-gen && go build -o "$bin" sigs.k8s.io/controller-tools/cmd/controller-gen)
fi
"$bin" object paths=./api/...
"$bin" crd:crdVersions=v1 paths=./api/... output:crd:stdout > packaging/kubernetes/controller/crd.yaml
