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
	PreCheckpointExec = Prefix + "pre-checkpoint-exec"
	PostRestoreExec   = Prefix + "post-restore-exec"

	// Compatibility aliases.
	KruiseArchiveLocation = "agents.kruise.io/archive-location"
	KataRestoreFrom       = "io.katacontainers.restore-from"
)

var known = map[string]bool{
	VCPUs: true, Memory: true, RestoreFrom: true, RestoreDigest: true, CheckpointTo: true,
	RestoreFallback: true, PreCheckpointExec: true, PostRestoreExec: true,
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
	PreCheckpoint   string
	PostRestore     string
}

// Parse reads annotations with the node config's defaults and limits.
// Unknown cryo.dev/ keys, keys the node did not enable and values out of
// bounds are errors (errdefs.ErrInvalidArgument) naming the key.
func Parse(a map[string]string, cfg configs.Config) (Request, error) {
	r := Request{
		VCPUs:           cfg.Hypervisor.VCPUs,
		MemoryMiB:       cfg.Hypervisor.MemoryMiB,
		RestoreFallback: cfg.Restore.Fallback,
		CheckpointTo:    cfg.Stores.DefaultCheckpointTo,
	}
	for k, v := range a {
		if !strings.HasPrefix(k, Prefix) {
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
		case PreCheckpointExec:
			r.PreCheckpoint = v
		case PostRestoreExec:
			r.PostRestore = v
		}
		if err != nil {
			return r, invalid(k, v, err.Error())
		}
	}
	if r.RestoreFrom == "" {
		r.RestoreFrom = a[KruiseArchiveLocation]
	}
	if name := a[KataRestoreFrom]; r.RestoreFrom == "" && name != "" {
		if cfg.Snapshot.LocalRoot == "" || strings.ContainsAny(name, "/\\") || name == "." || name == ".." {
			return r, invalid(KataRestoreFrom, name, "must be a plain snapshot name under the node's snapshot.local_root")
		}
		r.RestoreFrom = "file://" + path.Join(cfg.Snapshot.LocalRoot, name)
	}
	return withPodSize(r, a, cfg)
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

func invalid(k, v, why string) error {
	return fmt.Errorf("annotation %s=%q: %s: %w", k, v, why, errdefs.ErrInvalidArgument)
}
