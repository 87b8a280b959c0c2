package configs

import (
	"errors"
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
		err := s.Allows(tc.url)
		if tc.ok != (err == nil) {
			t.Errorf("Allows(%q) = %v, want ok=%v", tc.url, err, tc.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrPermissionDenied) && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Allows(%q) error %v is not permission denied / invalid argument", tc.url, err)
		}
	}
}
