# cryo: containerd-shim-cryo-v2, cryoctl, the guest agent and image.
#
#   make demo   set everything up on a fresh machine and run the demo
#   make test   set everything up and run unit + integration tests

GO        ?= go
OUT       ?= $(CURDIR)/_output
BIN       := $(OUT)/bin
IMAGES    := $(OUT)/images
GUEST     := $(OUT)/guest
CRYO_TOOLS ?= /var/cache/cryo/tools
export CRYO_TOOLS
GOFLAGS_BUILD := -trimpath -ldflags "-s -w"

.PHONY: all build binaries controller-image guest deps deps-demo tools test unit integration critest crisuite bench-k8s bench-e2b demo demo-k8s demo-e2b clean

all: build

build: binaries guest

binaries:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/containerd-shim-cryo-v2 ./cmd/containerd-shim-cryo-v2
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/cryoctl ./cmd/cryoctl
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/cryo-agent ./cmd/cryo-agent
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/cryo-controller ./cmd/cryo-controller

# The controller's image, an OCI archive for `ctr -n k8s.io images import`
# (or a registry push): one static binary, no Docker (hack/mkimage -bin).
CONTROLLER_IMAGE ?= cryo.dev/cryo-controller:dev
controller-image:
	@mkdir -p $(BIN) $(IMAGES)
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/cryo-controller ./cmd/cryo-controller
	$(GO) run ./hack/mkimage -bin $(BIN)/cryo-controller $(IMAGES)/cryo-controller.tar $(CONTROLLER_IMAGE)

# The guest kernel (Debian's cloud kernel package) and the initrd with
# cryo-agent as PID 1.
guest:
	packaging/guest/build.sh $(GUEST)

# Debian packages (runc among them) and the Go-built tools (containerd, ctr,
# containerd-shim-runc-v2, crictl, CNI
# plugins, versitygw, registry, kube-apiserver, kubelet, kubectl, etcd,
# critest and containerd's CRI integration tests),
# cached by version under $(CRYO_TOOLS).
deps:
	hack/deps.sh all

# Only what hack/demo.sh and hack/demo-cri.sh run: the Debian packages,
# containerd and ctr, crictl, the CNI plugins (minutes, not the half hour
# the Kubernetes and etcd builds of `deps` take on a fresh machine).
deps-demo:
	hack/deps.sh containerd crictl cni

tools: deps

unit:
	$(GO) test ./...

integration: deps build controller-image
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH \
		$(GO) test -tags integration -p 1 -count=1 -timeout 60m ./...

# deps, build, vet, then the tests under gotestsum (hack/test.sh): it ends
# with the slowest tests, the time of each phase and what failed; the output
# and the test events are in $(OUT)/test (docs/testing.md). TESTFLAGS go to
# go test (TESTFLAGS='-run ^TestRunEcho$$'), TESTPKGS narrows the packages.
test:
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH OUT=$(OUT) MAKE="$(MAKE)" \
		TESTPKGS='$(TESTPKGS)' TESTFLAGS='$(TESTFLAGS)' hack/test.sh

# cri-tools' validation suite against the cryo handler (the subset a VM
# runtime can pass: docs/critest.md).
critest: deps build
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH \
		$(GO) test -tags integration -count=1 -timeout 40m -run TestCritest -v ./integration/

# containerd's own CRI integration tests against the cryo handler (all
# but the skip list in docs/crisuite.md). Set
# CRYO_CRISUITE_RUN / CRYO_CRISUITE_SKIP to choose other tests.
crisuite: deps build
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH \
		$(GO) test -tags integration -count=1 -timeout 100m -run TestContainerdCRISuite -v ./integration/

# The hibernation loop at the cluster level (BenchmarkK8sHibernateResume):
# hibernate and resume through the Checkpoint resource, p50 and p95 over
# 20 cycles (docs/performance.md).
bench-k8s: deps build controller-image
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH \
		$(GO) test -tags integration -count=1 -timeout 60m -run '^$$' -bench BenchmarkK8sHibernateResume -benchtime 20x -v ./integration/

# Pause and resume through E2B's SDK (BenchmarkE2BPauseResume): p50 and
# p95 over 20 cycles and the bytes each pause uploaded, against E2B's
# published figures (docs/e2b.md).
bench-e2b: deps build controller-image
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH \
		$(GO) test -tags integration -count=1 -timeout 90m -run '^$$' -bench BenchmarkE2BPauseResume -benchtime 20x -v ./integration/

demo: deps-demo build
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH hack/demo.sh
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH hack/demo-cri.sh

# A one-node Kubernetes (`make deps`) on the CRI demo's containerd, with
# versitygw and the cryo controller (`make controller-image`) as a
# Deployment: hibernate, resume and fork a pod with kubectl only.
demo-k8s: deps build controller-image
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH hack/demo-k8s.sh

# The same cluster with the E2B API and gateway: an agent-like script
# through E2B's SDK (hack/demo-e2b.mjs): create, write state, pause,
# resume, fork, each step timed.
demo-e2b: deps build controller-image
	CRYO_BIN=$(BIN) CRYO_GUEST_DIR=$(GUEST) PATH=$(CRYO_TOOLS)/bin:$$PATH hack/demo-e2b.sh

clean:
	rm -rf $(OUT)
