package configs

import (
	"fmt"
	"strings"

	"github.com/cryo-runtime/cryo/stores"
)

// NamespacePlaceholder, as a whole path segment of a [stores] allowed entry
// ("s3://bucket/{namespace}/"), stands for the namespace of the sandbox that
// restores or checkpoints ([stores.Allows]).
const NamespacePlaceholder = stores.NamespacePlaceholder

// Allows checks a snapshot store URL that a sandbox of namespace ns names
// against the node's [stores] allowed list ([stores.Allows]).
func (s Stores) Allows(raw, ns string) error { return stores.Allows(s.Allowed, raw, ns) }

// validateAllowed checks the [stores] allowed entries: a placeholder must
// be one whole path segment, once, so that each namespace owns exactly one
// subtree.
func validateAllowed(allowed []string) error {
	for _, p := range allowed {
		n := strings.Count(p, NamespacePlaceholder)
		if n == 0 {
			continue
		}
		i := strings.Index(p, NamespacePlaceholder)
		after := p[i+len(NamespacePlaceholder):]
		hostEnd := -1
		if j := strings.Index(p, "://"); j >= 0 {
			if k := strings.IndexByte(p[j+3:], '/'); k >= 0 {
				hostEnd = j + 3 + k
			}
		}
		if n > 1 || hostEnd < 0 || i <= hostEnd || p[i-1] != '/' || !strings.HasPrefix(after, "/") {
			return fmt.Errorf("stores.allowed %q: %s must be one whole path segment followed by '/', such as s3://bucket/%s/", p, NamespacePlaceholder, NamespacePlaceholder)
		}
	}
	return nil
}
