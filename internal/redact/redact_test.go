package redact

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// secrets are the strings that must never survive redaction.
var secrets = []string{"s3cr3t-pass", "AKIAEXAMPLEKEY", "wJalrXUtnFEMI", "deadbeefsig", "tok3n-value"}

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://bob:s3cr3t-pass@store.example/x:v1", "https://" + Mark + "@store.example/x:v1"},
		{"s3://bucket/a/b:v1", "s3://bucket/a/b:v1"},
		{"https://cdn.example/blob?X-Amz-Credential=AKIAEXAMPLEKEY&X-Amz-Signature=deadbeefsig",
			"https://cdn.example/blob?X-Amz-Credential=" + Mark + "&X-Amz-Signature=" + Mark},
		{"oci://u:tok3n-value@reg:5000/r:1", "oci://" + Mark + "@reg:5000/r:1"},
		{"https://u:s3cr3t-pass@h\x7f/x?sig=deadbeefsig", "https://" + Mark + "@h\x7f/x?sig=" + Mark},
	} {
		if got := URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestErrorMessages formats errors the way the store clients do (net/http's
// url.Error, oras' response errors, our own wrapping) and greps the result
// for every secret.
func TestErrorMessages(t *testing.T) {
	base := []error{
		fmt.Errorf(`Get "https://bob:s3cr3t-pass@store.example/index.json": dial tcp: connection refused`),
		fmt.Errorf("GET https://cdn.example/blobs/sha256/ab?X-Amz-Credential=AKIAEXAMPLEKEY%%2F20260101&X-Amz-Signature=deadbeefsig: response status code 403: %w", errdefs.ErrPermissionDenied),
		fmt.Errorf("restore from oci://u:tok3n-value@reg:5000/r:1: %w", errdefs.ErrNotFound),
		fmt.Errorf("s3: The request signature we calculated does not match (secret wJalrXUtnFEMI)"),
	}
	for _, err := range base {
		red := Error(fmt.Errorf("restore: %w", err), "wJalrXUtnFEMI")
		for _, s := range secrets {
			if strings.Contains(red.Error(), s) {
				t.Errorf("redacted error %q still holds %q", red, s)
			}
		}
		if !strings.Contains(red.Error(), Mark) {
			t.Errorf("redacted error %q has no %s mark", red, Mark)
		}
		if !errors.Is(red, err) {
			t.Errorf("redacted error does not unwrap to its cause")
		}
	}
	if Error(nil) != nil {
		t.Fatal("Error(nil) != nil")
	}
	plain := errors.New("open store: no such file")
	if Error(plain) != plain {
		t.Fatal("an error without credentials must come back unchanged")
	}
	if !errdefs.IsPermissionDenied(Error(base[1])) {
		t.Fatal("redaction lost the errdefs class")
	}
}
