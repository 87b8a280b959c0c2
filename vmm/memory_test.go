package vmm

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCheckSealed refuses a RAM file short of any seal: one a QEMU could
// write, truncate or grow, or unseal.
func TestCheckSealed(t *testing.T) {
	for _, c := range []struct {
		name  string
		seals int
		want  string // "" accepted
	}{
		{"all", Seals, ""},
		{"all and future write", Seals | unix.F_SEAL_FUTURE_WRITE, ""},
		{"no write seal", Seals &^ unix.F_SEAL_WRITE, "seals"},
		{"no shrink seal", Seals &^ unix.F_SEAL_SHRINK, "seals"},
		{"no grow seal", Seals &^ unix.F_SEAL_GROW, "seals"},
		{"seals removable", Seals &^ unix.F_SEAL_SEAL, "seals"},
		{"unsealed", 0, "seals"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := memfd(t, c.seals)
			err := checkSealed(f)
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("checkSealed = %v, want %q", err, c.want)
			}
		})
	}
	f, err := os.CreateTemp(t.TempDir(), "ram")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := checkSealed(f); err == nil {
		t.Fatal("a plain file passed as sealed")
	}
}

func memfd(t *testing.T, seals int) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("cryo-test", unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	// Without F_SEAL_SEAL the file could be unsealed; add it last.
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals&^unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	if seals&unix.F_SEAL_SEAL != 0 {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
