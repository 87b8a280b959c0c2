package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
	"github.com/cryo-runtime/cryo/stores"
)

// Pod annotations the controller and its webhook read and write. They are
// spelled out here, not imported from the annotations package, so that the
// cluster side does not link the node's config parser.
const (
	AnnotationCheckpointTo      = "cryo.dev/checkpoint-to"
	AnnotationRestoreFrom       = "cryo.dev/restore-from"
	AnnotationRestoreDigest     = "cryo.dev/restore-digest"
	AnnotationRestoreCheckpoint = "cryo.dev/restore-checkpoint"
	// AnnotationKruiseRestoreFrom is OpenKruise Agents' restore annotation,
	// an alias of AnnotationRestoreCheckpoint (it names a Checkpoint).
	AnnotationKruiseRestoreFrom = "agents.kruise.io/restore-from"

	// Metadata annotations the shim writes when it publishes a snapshot.
	AnnotationUploadedBytes = "dev.cryo.uploaded-bytes"
	AnnotationPauseWindow   = "dev.cryo.pause-window"

	// Finalizer removes the Checkpoint's tag from the store.
	Finalizer = "cryo.dev/snapshot-tag"
)

// maxTag is the longest OCI tag.
const maxTag = 128

// ValidateSpec checks what the CRD's schema cannot: the TTL's value and the
// persistent contents (repeated here so that an object written before the
// schema, or by a client that skipped it, is still refused by name).
func ValidateSpec(spec cryov1.CheckpointSpec) error {
	if spec.PodName == "" {
		return fmt.Errorf("spec.podName is required")
	}
	for i, c := range spec.PersistentContents {
		if c != cryov1.ContentsMemory && c != cryov1.ContentsFilesystem {
			return fmt.Errorf("spec.persistentContents[%d] %q: cryo captures memory and filesystem only", i, c)
		}
	}
	if spec.TTLAfterFinished != "" {
		if _, err := ParseTTL(spec.TTLAfterFinished); err != nil {
			return fmt.Errorf("spec.ttlAfterFinished: %w", err)
		}
	}
	if spec.Store != "" {
		_, tag, err := splitTarget(spec.Store)
		if err != nil {
			return fmt.Errorf("spec.store: %w", err)
		}
		if tag != "" {
			return fmt.Errorf("spec.store %q: a repository URL without a tag", spec.Store)
		}
	}
	return nil
}

// ParseTTL reads a Go duration ("1h30m") or OpenKruise's Nd/Nh/Nm/Ns forms,
// a day being 24 hours (whole days, alone: not "1.5d" or "1d12h"). It must
// be positive and at most ten years. The CRD refuses exactly what it
// refuses: the pattern of spec.ttlAfterFinished is this grammar, its CEL
// rule these bounds (api/v1alpha1, TestTTLAsTheAPIServerSeesIt); change
// them together.
func ParseTTL(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		days, ok := strings.CutSuffix(s, "d")
		n, nerr := strconv.ParseInt(days, 10, 64)
		if !ok || nerr != nil || n < 0 || n > 3650 {
			return 0, fmt.Errorf("%q is neither a Go duration nor Nd/Nh/Nm/Ns", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	}
	if d <= 0 || d > 3650*24*time.Hour {
		return 0, fmt.Errorf("%q: must be positive and at most 3650d", s)
	}
	return d, nil
}

// splitTarget splits a checkpoint target "<repo-url>:<tag>" into the
// repository URL and the tag (tag "" when there is none).
func splitTarget(target string) (repo, tag string, err error) {
	scheme, rest, ok := strings.Cut(target, "://")
	if !ok || scheme == "" || rest == "" {
		return "", "", fmt.Errorf("%q is not a store URL (scheme://...)", target)
	}
	if strings.Contains(target, "@") {
		return "", "", fmt.Errorf("%q: a target names a tag, not a digest", target)
	}
	slash := strings.LastIndexByte(rest, '/')
	last := rest[slash+1:]
	if i := strings.LastIndexByte(last, ':'); i >= 0 && slash >= 0 {
		return scheme + "://" + rest[:slash+1] + last[:i], last[i+1:], nil
	}
	return strings.TrimSuffix(target, "/"), "", nil
}

// podTarget is the pod's checkpoint target, its repository and tag; err
// when the pod has none or it is malformed.
func podTarget(pod *corev1.Pod) (target, repo, tag string, err error) {
	target = pod.Annotations[AnnotationCheckpointTo]
	if target == "" {
		return "", "", "", fmt.Errorf("pod %s has no %s annotation (the controller's webhook sets it on cryo pods created while it runs with --default-store)", pod.Name, AnnotationCheckpointTo)
	}
	repo, tag, err = splitTarget(target)
	if err == nil && tag == "" {
		err = fmt.Errorf("%s %q names no tag", AnnotationCheckpointTo, target)
	}
	if err != nil {
		return "", "", "", err
	}
	return target, repo, tag, nil
}

// CheckStoreBase checks a --default-store value: a store URL without a tag.
func CheckStoreBase(base string) error {
	_, tag, err := splitTarget(base)
	if err == nil && tag != "" {
		err = fmt.Errorf("%q names a tag: want a base URL such as s3://bucket/cryo", base)
	}
	return err
}

// DefaultTarget is the checkpoint target of a pod the webhook fills in:
// "<base>/<namespace>/pods:pod-<name>", the tag shortened with a hash of
// the name when it would exceed an OCI tag's 128 characters. The namespace
// is a directory, not the repository's name, so that a node's namespaced
// [stores] allowed entry ("s3://bucket/cryo/{namespace}/") admits it; one
// repository per namespace lets its pods' snapshots share chunks.
func DefaultTarget(base, namespace, podName string) string {
	return strings.TrimSuffix(base, "/") + "/" + namespace + "/pods:" + podTag(podName)
}

// namespaceStore is namespace ns's directory under the store base.
func namespaceStore(base, ns string) string {
	if base == "" {
		return "(none: the controller has no --default-store)"
	}
	return strings.TrimSuffix(base, "/") + "/" + ns
}

// inNamespaceStore says whether repo is namespace ns's directory under
// base, or inside it: the node's allowlist check with the one namespaced
// entry <base>/{namespace} (the URL parsed, at a path boundary, no "..",
// query or user info).
func inNamespaceStore(base, ns, repo string) bool {
	if base == "" {
		return false
	}
	return stores.Allows([]string{strings.TrimSuffix(base, "/") + "/" + stores.NamespacePlaceholder}, repo, ns) == nil
}

func podTag(name string) string {
	tag := "pod-" + name
	if len(tag) <= maxTag {
		return tag
	}
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:8])
	return tag[:maxTag-len(h)-1] + "-" + h
}

// checkpointTag is the store tag that keeps a Checkpoint's snapshot.
func checkpointTag(cp *cryov1.Checkpoint) string { return "cp-" + string(cp.UID) }

// splitSnapshot splits status.snapshot "<repo>@sha256:<hex>".
func splitSnapshot(s string) (repo, digest string, ok bool) {
	repo, digest, ok = strings.Cut(s, "@")
	return repo, digest, ok && repo != "" && strings.HasPrefix(digest, "sha256:") && len(digest) == 71
}

// isCryoPod says whether the pod runs under one of the cryo RuntimeClasses.
func isCryoPod(pod *corev1.Pod, classes []string) bool {
	if pod.Spec.RuntimeClassName == nil {
		return false
	}
	for _, c := range classes {
		if *pod.Spec.RuntimeClassName == c {
			return true
		}
	}
	return false
}

// keepRunning is spec.keepRunning with its default (true).
func keepRunning(spec cryov1.CheckpointSpec) bool {
	return spec.KeepRunning == nil || *spec.KeepRunning
}
