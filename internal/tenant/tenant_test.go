package tenant

import (
	"strings"
	"testing"
)

func TestCheckNamespace(t *testing.T) {
	for _, ns := range []string{"default", "k8s.io", "team-a", "a", "cryo_test-1", "team--b"} {
		if err := CheckNamespace(ns); err != nil {
			t.Errorf("%q: %v", ns, err)
		}
	}
	for _, ns := range []string{"", ".", "..", "a/b", "a..b", ".hidden", "a\x00b", "x-", strings.Repeat("a", 77)} {
		if err := CheckNamespace(ns); err == nil {
			t.Errorf("%q accepted", ns)
		}
	}
}
