#!/usr/bin/env bash
# Builds the test and demo tools from the Go module proxy into a version-keyed cache
# that survives fresh clones on the same machine:
#   $CRYO_TOOLS/<name>@<version>/bin/...   and symlinks in $CRYO_TOOLS/bin
# usage: hack/tools.sh [containerd|crictl|critest|crisuite|cni|versitygw|registry|k8s|etcd|e2b-sdk|gotestsum|all]...
set -euo pipefail
HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CRYO_TOOLS=${CRYO_TOOLS:-/var/cache/cryo/tools}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
CRITEST_VERSION=${CRITEST_VERSION:-$CRICTL_VERSION}
CNI_VERSION=${CNI_VERSION:-v1.9.1}
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
# The official E2B SDK the E2B API's tests drive (integration/harness/e2b.go).
E2B_SDK_VERSION=${E2B_SDK_VERSION:-2.51.0}
# gotestsum runs make test's go test phases (hack/test.sh): JSON of every
# test event, and the slowest tests from it.
GOTESTSUM_VERSION=${GOTESTSUM_VERSION:-v1.13.0}
export GOFLAGS=${GOFLAGS:-} CGO_ENABLED=${CGO_ENABLED:-0}
mkdir -p "$CRYO_TOOLS/bin"

# install NAME VERSION TAGS PKG...
install() {
	local name=$1 version=$2 tags=$3; shift 3
	local dir="$CRYO_TOOLS/$name@$version"
	if [ ! -f "$dir/.done" ]; then
		echo "tools: building $name $version (cached in $dir)" >&2
		rm -rf "$dir"; mkdir -p "$dir/bin"
		local p
		for p in "$@"; do
			GOBIN="$dir/bin" go install ${tags:+-tags "$tags"} "$p@$version"
		done
		touch "$dir/.done"
	fi
	local b
	for b in "$dir"/bin/*; do ln -sfn "$b" "$CRYO_TOOLS/bin/$(basename "$b")"; done
}

# critest (cri-tools' CRI validation suite) is a test binary: cmd/critest holds
# only _test.go files, so it is built with go test -c from the module source.
install_critest() {
	local dir="$CRYO_TOOLS/critest@$CRITEST_VERSION"
	if [ ! -f "$dir/.done" ]; then
		echo "tools: building critest $CRITEST_VERSION (cached in $dir)" >&2
		rm -rf "$dir"; mkdir -p "$dir/bin"
		local src
		src=$(cd / && go mod download -json "sigs.k8s.io/cri-tools@$CRITEST_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
		(cd "$src" && go test -c -o "$dir/bin/critest" ./cmd/critest)
		touch "$dir/.done"
	fi
	ln -sfn "$dir/bin/critest" "$CRYO_TOOLS/bin/critest"
}

# crisuite is containerd's own CRI integration suite (the integration package
# of the containerd module, at the version of the containerd built above),
# compiled with go test -c into cri-integration.test; integration/crisuite_test.go
# runs it against the cryo handler.
install_crisuite() {
	local dir="$CRYO_TOOLS/crisuite@$CONTAINERD_VERSION"
	if [ ! -f "$dir/.done" ]; then
		echo "tools: building crisuite (containerd $CONTAINERD_VERSION integration tests, cached in $dir)" >&2
		rm -rf "$dir"; mkdir -p "$dir/bin"
		local src start=$SECONDS
		src=$(cd / && go mod download -json "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
		# Built in the read-only module cache: the module's own go.mod and
		# go.sum decide, whatever GOFLAGS says.
		(cd "$src" && GOFLAGS= go test -c -tags no_btrfs -o "$dir/bin/cri-integration.test" ./integration)
		echo "tools: built crisuite in $((SECONDS - start))s" >&2
		touch "$dir/.done"
	fi
	ln -sfn "$dir/bin/cri-integration.test" "$CRYO_TOOLS/bin/cri-integration.test"
}

# modversion MODDIR MODULE: the version MODDIR/go.mod requires MODULE at; the
# wrapper modules' go.mod files are where the Kubernetes and etcd versions are set.
modversion() {
	awk -v m="$2" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' "$1/go.mod"
}

# install_wrapped NAME VERSION MODDIR LDFLAGS PKG...: go build PKGs inside the
# wrapper module MODDIR (hack/k8s, hack/etcd), which pins the modules that the
# tools' own go.mod replaces with local paths, so `go install pkg@version`
# cannot build them. A PKG written BIN=PKG is built as bin/BIN (etcd's main
# package is go.etcd.io/etcd/server/v3, which go build would name "server").
install_wrapped() {
	local name=$1 version=$2 moddir=$3 ldflags=$4; shift 4
	local dir="$CRYO_TOOLS/$name@$version"
	if [ ! -f "$dir/.done" ]; then
		echo "tools: building $name $version from $moddir (cached in $dir)" >&2
		rm -rf "$dir"; mkdir -p "$dir/bin"
		local start=$SECONDS
		local pkgs=() p
		for p in "$@"; do
			case $p in
			*=*) (cd "$moddir" && go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$dir/bin/${p%%=*}" "${p#*=}") ;;
			*) pkgs+=("$p") ;;
			esac
		done
		[ ${#pkgs[@]} -eq 0 ] || (cd "$moddir" && go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$dir/bin/" "${pkgs[@]}")
		echo "tools: built $name $version in $((SECONDS - start))s" >&2
		touch "$dir/.done"
	fi
	local b
	for b in "$dir"/bin/*; do ln -sfn "$b" "$CRYO_TOOLS/bin/$(basename "$b")"; done
}

install_k8s() {
	local v minor cv=k8s.io/component-base/version
	v=$(modversion "$HACK/k8s" k8s.io/kubernetes)
	minor=${v#v1.}; minor=${minor%%.*}
	# The version the binaries report (kubelet and apiserver compare them);
	# without these -X flags they say v0.0.0-master.
	install_wrapped k8s "$v" "$HACK/k8s" \
		"-s -w -X $cv.gitVersion=$v -X $cv.gitMajor=1 -X $cv.gitMinor=$minor -X $cv.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$v" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
	# The control loops (Deployments, ReplicaSets, garbage collection) and the
	# scheduler: a cache entry of their own, so a machine that cached the
	# three above builds only these.
	install_wrapped k8s-control "$v" "$HACK/k8s" \
		"-s -w -X $cv.gitVersion=$v -X $cv.gitMajor=1 -X $cv.gitMinor=$minor -X $cv.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$v" \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
}

install_etcd() {
	install_wrapped etcd "$(modversion "$HACK/etcd" go.etcd.io/etcd/server/v3)" "$HACK/etcd" "-s -w" \
		etcd=go.etcd.io/etcd/server/v3
}

# The E2B SDK from npm (Node.js): in $CRYO_TOOLS/e2b-sdk@<version>/node_modules.
install_e2b_sdk() {
	local dir="$CRYO_TOOLS/e2b-sdk@$E2B_SDK_VERSION"
	[ ! -f "$dir/.done" ] || return 0
	if ! command -v npm >/dev/null; then
		echo "tools: npm not found: install Node.js (18 or later) and npm for the E2B SDK tests" >&2
		return 0
	fi
	echo "tools: installing e2b $E2B_SDK_VERSION from npm (cached in $dir)" >&2
	npm install --prefix "$dir" --no-audit --no-fund "e2b@$E2B_SDK_VERSION" >/dev/null
	touch "$dir/.done"
}

want=("$@"); [ ${#want[@]} -gt 0 ] || want=(all)
for w in "${want[@]}"; do
	case $w in
	containerd|all)
		install containerd "$CONTAINERD_VERSION" no_btrfs \
			github.com/containerd/containerd/v2/cmd/containerd \
			github.com/containerd/containerd/v2/cmd/ctr
		# runc's shim, from the same containerd module, for the pods that run
		# under the RuntimeClass runc (the controller's); runc itself is
		# Debian's (hack/deps.sh). A cache entry of its own, so a machine
		# that cached containerd builds only the shim.
		install containerd-shim-runc "$CONTAINERD_VERSION" no_btrfs \
			github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 ;;&
	crictl|all) install crictl "$CRICTL_VERSION" "" sigs.k8s.io/cri-tools/cmd/crictl ;;&
	critest|all) install_critest ;;&
	crisuite|all) install_crisuite ;;&
	cni|all)
		install cni "$CNI_VERSION" "" \
			github.com/containernetworking/plugins/plugins/main/bridge \
			github.com/containernetworking/plugins/plugins/main/loopback \
			github.com/containernetworking/plugins/plugins/ipam/host-local ;;&
	versitygw|all) install versitygw "$VERSITYGW_VERSION" "" github.com/versity/versitygw/cmd/versitygw ;;&
	registry|all) install registry "$REGISTRY_VERSION" "" github.com/distribution/distribution/v3/cmd/registry ;;&
	k8s|all) install_k8s ;;&
	etcd|all) install_etcd ;;&
	e2b-sdk|all) install_e2b_sdk ;;&
	gotestsum|all) install gotestsum "$GOTESTSUM_VERSION" "" gotest.tools/gotestsum ;;&
	containerd|crictl|critest|crisuite|cni|versitygw|registry|k8s|etcd|e2b-sdk|gotestsum|all) ;;
	*) echo "tools: unknown tool $w" >&2; exit 2 ;;
	esac
done
