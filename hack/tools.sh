#!/usr/bin/env bash
# Builds the test and demo tools from the Go module proxy into a version-keyed cache
# that survives fresh clones on the same machine:
#   $CRYO_TOOLS/<name>@<version>/bin/...   and symlinks in $CRYO_TOOLS/bin
# usage: hack/tools.sh [containerd|crictl|cni|versitygw|registry|all]...
set -euo pipefail
CRYO_TOOLS=${CRYO_TOOLS:-/var/cache/cryo/tools}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
CNI_VERSION=${CNI_VERSION:-v1.9.1}
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
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

want=("$@"); [ ${#want[@]} -gt 0 ] || want=(all)
for w in "${want[@]}"; do
	case $w in
	containerd|all)
		install containerd "$CONTAINERD_VERSION" no_btrfs \
			github.com/containerd/containerd/v2/cmd/containerd \
			github.com/containerd/containerd/v2/cmd/ctr ;;&
	crictl|all) install crictl "$CRICTL_VERSION" "" sigs.k8s.io/cri-tools/cmd/crictl ;;&
	cni|all)
		install cni "$CNI_VERSION" "" \
			github.com/containernetworking/plugins/plugins/main/bridge \
			github.com/containernetworking/plugins/plugins/main/loopback \
			github.com/containernetworking/plugins/plugins/ipam/host-local ;;&
	versitygw|all) install versitygw "$VERSITYGW_VERSION" "" github.com/versity/versitygw/cmd/versitygw ;;&
	registry|all) install registry "$REGISTRY_VERSION" "" github.com/distribution/distribution/v3/cmd/registry ;;&
	containerd|crictl|cni|versitygw|registry|all) ;;
	*) echo "tools: unknown tool $w" >&2; exit 2 ;;
	esac
done
