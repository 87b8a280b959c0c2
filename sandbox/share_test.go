package sandbox

import (
	"strings"
	"testing"
)

// TestBaseScope: a base is shared within one tenant and one store, and
// its scope is a store id nodecache accepts.
func TestBaseScope(t *testing.T) {
	a := baseScope("team-a", "s3://bucket/agents/app:v1")
	if b := baseScope("team-a", "s3://bucket/agents/app:v2"); a != b {
		t.Errorf("two references into one store: %s and %s", a, b)
	}
	if b := baseScope("team-b", "s3://bucket/agents/app:v1"); a == b {
		t.Error("two tenants share a base scope")
	}
	if b := baseScope("team-a", "s3://other/agents/app:v1"); a == b {
		t.Error("two stores share a base scope")
	}
	if len(a) != 32 || strings.ToLower(a) != a {
		t.Errorf("scope %q is not a store id", a)
	}
}
