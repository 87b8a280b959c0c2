// Package tenant checks the names of tenants: the namespace a sandbox
// belongs to, which becomes a path segment of its store URLs and the name
// of its key file, so every package that builds one of those checks it the
// same way.
package tenant

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// namespaceRe accepts Kubernetes namespaces (DNS labels) and containerd
// namespaces; the value becomes a URL path segment and a key file name, so
// it has no '/', no "..", no leading dot.
var namespaceRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,74}[A-Za-z0-9])?$`)

// CheckNamespace checks a tenant namespace before it is put into a store
// URL or a key file name.
func CheckNamespace(ns string) error {
	if !namespaceRe.MatchString(ns) || strings.Contains(ns, "..") {
		return fmt.Errorf("namespace %q: want letters, digits, '.', '_', '-' (at most 76, no '..'): %w", ns, errdefs.ErrInvalidArgument)
	}
	return nil
}
