package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestSaysPlainlyUnsignedUnencrypted: inspect and verify say in words when
// a snapshot is unsigned or plaintext; with a verify key (flag or config)
// verify refuses an unsigned snapshot unless require_signature = false,
// while inspect still shows it and says this node would refuse it.
func TestSaysPlainlyUnsignedUnencrypted(t *testing.T) {
	e := newEnv(t)
	url := "file://" + e.dir + "/store/web"
	e.writeSnapshot(url, "v1", 1, false, time.Time{})

	out := e.mustRun("inspect", url+":v1")
	for _, want := range []string{"NOT VERIFIED", "NO, PLAINTEXT"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect without a verify key does not say %q:\n%s", want, out)
		}
	}
	out = e.mustRun("--verify-key", e.pub, "inspect", url+":v1")
	if !strings.Contains(out, "NO, UNSIGNED") || !strings.Contains(out, "refuses") {
		t.Errorf("inspect with a verify key does not say the snapshot is unsigned and refused:\n%s", out)
	}
	if _, err := e.run("--verify-key", e.pub, "verify", url+":v1"); err == nil || !strings.Contains(err.Error(), "unsigned") {
		t.Fatalf("verify of an unsigned snapshot with a verify key: %v", err)
	}
	out = e.mustRun("verify", url+":v1")
	if !strings.Contains(out, "Signed: NOT VERIFIED") || !strings.Contains(out, "Encrypted: NO, PLAINTEXT") {
		t.Errorf("verify text:\n%s", out)
	}

	cfg, err := os.ReadFile(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	optional := string(cfg) + "verify_key = \"" + e.pub + "\"\nrequire_signature = false\n"
	if err := os.WriteFile(e.cfg, []byte(optional), 0o600); err != nil {
		t.Fatal(err)
	}
	out = e.mustRun("verify", url+":v1")
	if !strings.Contains(out, "Signed: NO, UNSIGNED") {
		t.Errorf("verify with require_signature = false:\n%s", out)
	}
}
