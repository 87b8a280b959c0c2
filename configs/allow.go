package configs

import (
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/containerd/errdefs"
)

// Allows checks a snapshot store URL against the node's [stores] allowed
// list. A URL is allowed when it lies under one of the listed prefixes at a
// path boundary; file:// paths are cleaned first, and any ".." segment, query
// or fragment is refused, so an annotation cannot climb out of an allowed
// directory or smuggle options to a store.
func (s Stores) Allows(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("store url %q: %w", raw, errdefs.ErrInvalidArgument)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("store url %q: queries, fragments and credentials are not allowed in a store url: %w", raw, errdefs.ErrPermissionDenied)
	}
	for _, seg := range strings.Split(u.Path, "/") {
		if seg == ".." || seg == "." {
			return fmt.Errorf("store url %q: relative path segments are not allowed: %w", raw, errdefs.ErrPermissionDenied)
		}
	}
	norm := raw
	if u.Scheme == "file" {
		if u.Host != "" {
			return fmt.Errorf("store url %q: file urls name a local path (file:///...): %w", raw, errdefs.ErrInvalidArgument)
		}
		norm = "file://" + path.Clean(u.Path)
	}
	for _, p := range s.Allowed {
		if p == "" {
			continue
		}
		if norm == p || strings.HasPrefix(norm, p) && (strings.HasSuffix(p, "/") || strings.ContainsAny(norm[len(p):len(p)+1], "/:@")) {
			return nil
		}
	}
	return fmt.Errorf("store url %q is not under any of the node's allowed stores ([stores] allowed): %w", raw, errdefs.ErrPermissionDenied)
}
