package fingerprint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestQEMUVersion(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ out, want, err string }{
		{"QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u16)", "7.2.22", ""},
		{"QEMU emulator version 10.1.0", "10.1.0", ""},
		{"not a qemu", "", "no version in"},
	} {
		qemu := filepath.Join(dir, "qemu-"+tc.want) // a new file each: no exec of a file just rewritten
		if err := os.WriteFile(qemu, []byte("#!/bin/sh\necho '"+tc.out+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		v, err := QEMUVersion(qemu)
		if v != tc.want || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("QEMUVersion printing %q = %q, %v; want %q, error %q", tc.out, v, err, tc.want, tc.err)
		}
	}
	if _, err := QEMUVersion(filepath.Join(dir, "missing")); err == nil {
		t.Error("QEMUVersion of a missing binary succeeded")
	}
}
