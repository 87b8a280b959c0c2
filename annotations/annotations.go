// Package annotations parses the pod and container annotations cryo honours
// into a typed request, once, and checks them against the node's
// configuration. An annotation can never name a host path, a binary or a
// URL that the node's config did not allow.
package annotations

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/internal/tenant"
)

// Keys cryo reads.
const (
	Prefix            = "cryo.dev/"
	VCPUs             = Prefix + "vcpus"
	Memory            = Prefix + "memory"
	RestoreFrom       = Prefix + "restore-from"
	RestoreDigest     = Prefix + "restore-digest"
	CheckpointTo      = Prefix + "checkpoint-to"
	RestoreFallback   = Prefix + "restore-fallback"
	RestoreMode       = Prefix + "restore-mode"
	PreCheckpointExec = Prefix + "pre-checkpoint-exec"
	PostRestoreExec   = Prefix + "post-restore-exec"
	// RestoreCheckpoint names the Checkpoint a pod is restored from. The
	// cluster's webhook (cmd/cryo-controller) resolves it into RestoreFrom
	// and RestoreDigest, which the node checks; the node only lets it
	// through (it names an API object, nothing on the node).
	RestoreCheckpoint = Prefix + "restore-checkpoint"
	// EnvdAccessTokenSHA256 turns envd (E2B's sandbox-side API) on in the
	// pod's guest: the lowercase hex SHA-256 of its access token. The
	// guest reads it from the container's spec (agent/envd.Annotation);
	// the node only checks its form.
	EnvdAccessTokenSHA256 = Prefix + "envd-access-token-sha256"

	// Compatibility aliases. Each is enabled or refused by the
	// [annotations] enabled list like the cryo.dev/ key it stands for.
	KruiseArchiveLocation = "agents.kruise.io/archive-location"
	KataRestoreFrom       = "io.katacontainers.restore-from"

	// containerd's CRI plugin sets these on sandbox and container specs,
	// after (over) the pod's own annotations. CRISandboxNamespace is the
	// pod's Kubernetes namespace.
	CRISandboxNamespace = "io.kubernetes.cri.sandbox-namespace"
	CRIContainerType    = "io.kubernetes.cri.container-type"
	CRIContainerName    = "io.kubernetes.cri.container-name"
	CRISandboxID        = "io.kubernetes.cri.sandbox-id"
	CRISandboxName      = "io.kubernetes.cri.sandbox-name"
	CRISandboxUID       = "io.kubernetes.cri.sandbox-uid"
	CRIImageName        = "io.kubernetes.cri.image-name"
)

var known = map[string]bool{
	VCPUs: true, Memory: true, RestoreFrom: true, RestoreDigest: true, CheckpointTo: true,
	RestoreFallback: true, RestoreMode: true, PreCheckpointExec: true, PostRestoreExec: true,
	EnvdAccessTokenSHA256: true,
}

// Request is what a sandbox's annotations ask of cryo.
type Request struct {
	VCPUs     int
	MemoryMiB int
	// RestoreFrom is a store URL (or, for the Kata alias, a name under the
	// node's local snapshot root turned into a file:// URL).
	RestoreFrom     string
	RestoreDigest   string
	CheckpointTo    string
	RestoreFallback string
	// RestoreMode is "eager" or "lazy" (configs.Restore.Mode unless the
	// pod asked for another the node allows).
	RestoreMode   string
	PreCheckpoint string
	PostRestore   string
	// Namespace is the pod's Kubernetes namespace (CRISandboxNamespace),
	// "" for a task that did not come through CRI.
	Namespace string
}

// Tenant is the namespace a sandbox's stores and keys belong to: the pod's
// Kubernetes namespace, or for a task created without CRI (ctr), its
// containerd namespace.
func Tenant(a map[string]string, containerdNS string) string {
	if ns := a[CRISandboxNamespace]; ns != "" {
		return ns
	}
	return containerdNS
}

// Parse reads annotations with the node config's defaults and limits.
// Unknown cryo.dev/ keys, keys the node did not enable and values out of
// bounds are errors (errdefs.ErrInvalidArgument) naming the key.
func Parse(a map[string]string, cfg configs.Config) (Request, error) {
	r := Request{
		VCPUs:           cfg.Hypervisor.VCPUs,
		MemoryMiB:       cfg.Hypervisor.MemoryMiB,
		RestoreFallback: cfg.Restore.Fallback,
		RestoreMode:     cfg.Restore.Mode,
		CheckpointTo:    cfg.Stores.DefaultCheckpointTo,
		Namespace:       a[CRISandboxNamespace],
	}
	for k, v := range a {
		if !strings.HasPrefix(k, Prefix) {
			continue
		}
		if k == RestoreCheckpoint {
			continue
		}
		if !known[k] {
			return r, invalid(k, v, "unknown cryo annotation")
		}
		if !enabled(k, cfg.Annotations.Enabled) {
			return r, invalid(k, v, "not enabled in the node's [annotations] enabled list")
		}
		var err error
		switch k {
		case VCPUs:
			r.VCPUs, err = bounded(v, 1, cfg.Hypervisor.MaxVCPUs)
		case Memory:
			r.MemoryMiB, err = memoryMiB(v, cfg.Hypervisor.MaxMemoryMiB)
		case RestoreFrom:
			r.RestoreFrom = v
		case RestoreDigest:
			if !strings.HasPrefix(v, "sha256:") || len(v) != 71 {
				err = fmt.Errorf("want sha256:<64 hex digits>")
			}
			r.RestoreDigest = v
		case CheckpointTo:
			r.CheckpointTo = v
		case RestoreFallback:
			if v != "fail" && v != "cold" {
				err = fmt.Errorf("want fail or cold")
			}
			r.RestoreFallback = v
		case RestoreMode:
			switch {
			case v != configs.RestoreEager && v != configs.RestoreLazy:
				err = fmt.Errorf("want eager or lazy")
			case !cfg.Restore.Allows(v):
				err = fmt.Errorf("this node does not allow %s restores (its [restore] mode and allowed_modes)", v)
			}
			r.RestoreMode = v
		case PreCheckpointExec:
			r.PreCheckpoint = v
		case PostRestoreExec:
			r.PostRestore = v
		case EnvdAccessTokenSHA256:
			if !isSHA256Hex(v) {
				err = fmt.Errorf("want 64 lowercase hex digits (the SHA-256 of the envd access token)")
			}
		}
		if err != nil {
			return r, invalid(k, v, err.Error())
		}
	}
	if err := r.aliases(a, cfg); err != nil {
		return r, err
	}
	return withPodSize(r, a, cfg)
}

// aliases reads the Kruise and Kata restore annotations when no
// cryo.dev/restore-from is set. They stand for cryo.dev/restore-from, so
// they are honoured only where the node enables it.
func (r *Request) aliases(a map[string]string, cfg configs.Config) error {
	for _, k := range []string{KruiseArchiveLocation, KataRestoreFrom} {
		if v, ok := a[k]; ok && !enabled(RestoreFrom, cfg.Annotations.Enabled) {
			return invalid(k, v, "an alias of "+RestoreFrom+", which is not enabled in the node's [annotations] enabled list")
		}
	}
	if r.RestoreFrom == "" {
		r.RestoreFrom = a[KruiseArchiveLocation]
	}
	name := a[KataRestoreFrom]
	if r.RestoreFrom != "" || name == "" {
		return nil
	}
	root := cfg.Snapshot.LocalRoot
	if root == "" || strings.ContainsAny(name, "/\\") || name == "." || name == ".." {
		return invalid(KataRestoreFrom, name, "must be a plain snapshot name under the node's snapshot.local_root")
	}
	if strings.Contains(root, configs.NamespacePlaceholder) {
		if err := tenant.CheckNamespace(r.Namespace); err != nil {
			return invalid(KataRestoreFrom, name, "the node's snapshot.local_root is per namespace and the pod has no valid "+CRISandboxNamespace)
		}
		root = strings.ReplaceAll(root, configs.NamespacePlaceholder, r.Namespace)
	}
	r.RestoreFrom = "file://" + path.Join(root, name)
	return nil
}

func enabled(key string, patterns []string) bool {
	for _, p := range patterns {
		if p == key || (strings.HasSuffix(p, "*") && strings.HasPrefix(key, strings.TrimSuffix(p, "*"))) {
			return true
		}
	}
	return false
}

func bounded(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("not a whole number")
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("must be between %d and %d", lo, hi)
	}
	return n, nil
}

// memoryMiB reads "512", "512Mi", "2Gi", "512M", "2G" as MiB.
func memoryMiB(v string, max int) (int, error) {
	mult := 1
	s := v
	for _, suf := range []struct {
		s string
		m int
	}{{"Gi", 1024}, {"Mi", 1}, {"G", 1024}, {"M", 1}} {
		if strings.HasSuffix(s, suf.s) {
			s, mult = strings.TrimSuffix(s, suf.s), suf.m
			break
		}
	}
	n, err := bounded(s, 1, max)
	if err != nil {
		return 0, err
	}
	n *= mult
	if n < 128 || n > max {
		return 0, fmt.Errorf("must be between 128 MiB and %d MiB", max)
	}
	return n, nil
}

func isSHA256Hex(v string) bool {
	if len(v) != 64 {
		return false
	}
	for _, c := range v {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func invalid(k, v, why string) error {
	return fmt.Errorf("annotation %s=%q: %s: %w", k, v, why, errdefs.ErrInvalidArgument)
}
