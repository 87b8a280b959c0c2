package configs

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestAllows(t *testing.T) {
	s := Stores{Allowed: []string{"file:///var/lib/cryo/store/", "s3://snapshots", "oci://127.0.0.1:5000/cryo/"}}
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"file:///var/lib/cryo/store/demo:v1", true},
		{"file:///var/lib/cryo/store/a/b:v1", true},
		{"file:///var/lib/cryo/store/../../etc/passwd:x", false},
		{"file:///var/lib/cryo/store/./x:1", false},
		{"file:///var/lib/cryo/storex:1", false},
		{"file:///etc/shadow", false},
		{"file://host/var/lib/cryo/store/x:1", false},
		{"s3://snapshots/agents/a:1", true},
		{"s3://snapshots:1", true},
		{"s3://snapshots-evil/a:1", false},
		{"s3://snapshots/a:1?endpoint=evil", false},
		{"oci://127.0.0.1:5000/cryo/agent:v1", true},
		{"oci://127.0.0.1:5000/other/agent:v1", false},
		{"https://example.com/x", false},
		{"oci://user:pw@127.0.0.1:5000/cryo/x:1", false},
	} {
		err := s.Allows(tc.url, "team-a")
		if tc.ok != (err == nil) {
			t.Errorf("Allows(%q) = %v, want ok=%v", tc.url, err, tc.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrPermissionDenied) && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Allows(%q) error %v is not permission denied / invalid argument", tc.url, err)
		}
	}
}

// TestAllowsNamespaced: a namespaced entry admits only the sandbox's own
// namespace, and the refusal names both namespaces; node-wide entries stay
// open to every namespace.
func TestAllowsNamespaced(t *testing.T) {
	s := Stores{Allowed: []string{
		"s3://snapshots/{namespace}/", "file:///var/lib/cryo/store/{namespace}/", "oci://127.0.0.1:5000/tenants/{namespace}/",
		"s3://templates/",
	}}
	for _, tc := range []struct {
		url, ns string
		ok      bool
		names   []string // what the refusal must mention
	}{
		{"s3://snapshots/team-a/agent:v1", "team-a", true, nil},
		{"s3://snapshots/team-a/sub/agent:v1", "team-a", true, nil},
		{"file:///var/lib/cryo/store/team-a/agent:v1", "team-a", true, nil},
		{"oci://127.0.0.1:5000/tenants/team-a/agent:v1", "team-a", true, nil},
		{"s3://templates/base:v1", "team-a", true, nil},
		{"s3://templates/base:v1", "", true, nil},
		{"s3://snapshots/team-b/agent:v1", "team-a", false, []string{`"team-b"`, `"team-a"`}},
		{"file:///var/lib/cryo/store/team-b/agent:v1", "team-a", false, []string{`"team-b"`, `"team-a"`}},
		{"oci://127.0.0.1:5000/tenants/team-b/agent:v1", "team-a", false, []string{`"team-b"`, `"team-a"`}},
		{"file:///var/lib/cryo/store/team-a/../team-b/agent:v1", "team-a", false, []string{"relative"}},
		{"s3://snapshots/team-a-evil/agent:v1", "team-a", false, []string{`"team-a-evil"`}},
		{"s3://snapshots/agent:v1", "team-a", false, []string{`"team-a"`}},
		{"s3://snapshots/team-a/agent:v1", "", false, []string{"no namespace"}},
		{"s3://snapshots/x/agent:v1", "x/../y", false, []string{`"x/../y"`}},
	} {
		err := s.Allows(tc.url, tc.ns)
		if tc.ok != (err == nil) {
			t.Errorf("Allows(%q, %q) = %v, want ok=%v", tc.url, tc.ns, err, tc.ok)
			continue
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("Allows(%q, %q) error %v is not permission denied", tc.url, tc.ns, err)
		}
		for _, n := range tc.names {
			if !strings.Contains(err.Error(), n) {
				t.Errorf("Allows(%q, %q) = %v, want it to name %s", tc.url, tc.ns, err, n)
			}
		}
	}
}

// TestAllowsRedacts: a refused URL's credentials and query values do not
// appear in the error.
func TestAllowsRedacts(t *testing.T) {
	s := Stores{Allowed: []string{"s3://snapshots/{namespace}/"}}
	for _, u := range []string{
		"s3://AKIAEXAMPLE:s3cr3t-pw@snapshots/team-a/x:1",
		"https://store.example/team-a/x:1?X-Amz-Signature=s3cr3t-pw",
		"s3://u:s3cr3t-pw@other/x:1",
	} {
		err := s.Allows(u, "team-a")
		if err == nil || strings.Contains(err.Error(), "s3cr3t-pw") {
			t.Errorf("Allows(%q) = %v: want a refusal without the secret", u, err)
		}
	}
}

func TestValidateAllowed(t *testing.T) {
	for _, p := range []string{"s3://b/{namespace}/", "file:///x/{namespace}/y/", "oci://r:5000/{namespace}/"} {
		if err := validateAllowed([]string{p}); err != nil {
			t.Errorf("%q refused: %v", p, err)
		}
	}
	for _, p := range []string{"s3://b/{namespace}", "s3://b/x{namespace}/", "oci://{namespace}/", "s3://{namespace}.b/x/", "s3://b/{namespace}/{namespace}/"} {
		if err := validateAllowed([]string{p}); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
}
