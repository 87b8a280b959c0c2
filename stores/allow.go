package stores

import (
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/internal/redact"
	"github.com/cryo-runtime/cryo/internal/tenant"
)

// NamespacePlaceholder, as a whole path segment of a [stores] allowed entry
// ("s3://bucket/{namespace}/"), stands for the namespace of the sandbox that
// restores or checkpoints: each tenant reaches only its own part of a shared
// store. An entry without it is node-wide: every sandbox of the node may use
// it, as before namespaces existed.
const NamespacePlaceholder = "{namespace}"

// Allows checks a snapshot store URL that a sandbox of namespace ns names
// against an allowed list (the node's [stores] allowed; the cluster
// controller's namespace directories). A URL is allowed when it lies
// under one of the listed prefixes at a path boundary, a namespaced entry
// counting only with ns in place of its placeholder; file:// paths are
// cleaned first, and any ".." segment, query, fragment or user info is
// refused, so an annotation cannot climb out of an allowed directory,
// smuggle options to a store or carry credentials. ns "" (or an invalid
// one) matches only node-wide entries.
func Allows(allowed []string, raw, ns string) error {
	norm, err := normalizeStoreURL(raw)
	if err != nil {
		return err
	}
	nsOK := ns != "" && tenant.CheckNamespace(ns) == nil
	owner := ""
	for _, p := range allowed {
		i := strings.Index(p, NamespacePlaceholder)
		if i < 0 {
			if underPrefix(norm, p) {
				return nil
			}
			continue
		}
		if nsOK && underPrefix(norm, strings.Replace(p, NamespacePlaceholder, ns, 1)) {
			return nil
		}
		if o := ownerSegment(norm, p[:i]); o != "" && owner == "" {
			owner = o
		}
	}
	shown := redact.URL(raw)
	switch {
	case owner != "" && owner != ns && ns != "":
		return fmt.Errorf("store url %q belongs to namespace %q, the sandbox is in namespace %q: a sandbox restores from and checkpoints to its own namespace's stores only: %w",
			shown, owner, ns, errdefs.ErrPermissionDenied)
	case ns == "":
		return fmt.Errorf("store url %q is not under any of the node's node-wide allowed stores ([stores] allowed), and the sandbox has no namespace for the namespaced ones: %w", shown, errdefs.ErrPermissionDenied)
	case !nsOK:
		return fmt.Errorf("store url %q is not under any node-wide allowed store, and the sandbox's namespace %q cannot name a namespaced one: %w", shown, ns, errdefs.ErrPermissionDenied)
	}
	return fmt.Errorf("store url %q is not under any of the node's allowed stores for namespace %q ([stores] allowed): %w", shown, ns, errdefs.ErrPermissionDenied)
}

// normalizeStoreURL refuses what no store URL may carry and cleans file://
// paths.
func normalizeStoreURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("store url %q: %w", redact.URL(raw), errdefs.ErrInvalidArgument)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("store url %q: queries, fragments and credentials are not allowed in a store url: %w", redact.URL(raw), errdefs.ErrPermissionDenied)
	}
	for _, seg := range strings.Split(u.Path, "/") {
		if seg == ".." || seg == "." {
			return "", fmt.Errorf("store url %q: relative path segments are not allowed: %w", raw, errdefs.ErrPermissionDenied)
		}
	}
	if u.Scheme != "file" {
		return raw, nil
	}
	if u.Host != "" {
		return "", fmt.Errorf("store url %q: file urls name a local path (file:///...): %w", raw, errdefs.ErrInvalidArgument)
	}
	return "file://" + path.Clean(u.Path), nil
}

func underPrefix(norm, p string) bool {
	if p == "" {
		return false
	}
	return norm == p || strings.HasPrefix(norm, p) && (strings.HasSuffix(p, "/") || strings.ContainsAny(norm[len(p):len(p)+1], "/:@"))
}

// ownerSegment is the path segment of norm where a namespaced entry has its
// placeholder: the namespace the URL belongs to, "" when it has none.
func ownerSegment(norm, before string) string {
	if !strings.HasPrefix(norm, before) {
		return ""
	}
	rest := norm[len(before):]
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return ""
	}
	return rest[:i]
}
