package vmm

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/internal/sparse"
)

func TestLeaseUIDOnePerMachine(t *testing.T) {
	c := Confinement{UIDBase: 4000, UIDCount: 2, LockDir: filepath.Join(t.TempDir(), "uids")}
	a, err := leaseUID(c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := leaseUID(c)
	if err != nil {
		t.Fatal(err)
	}
	if a.uid == b.uid || a.uid < 4000 || b.uid > 4001 {
		t.Errorf("leased %d and %d from 4000+2", a.uid, b.uid)
	}
	if _, err := leaseUID(c); !errdefs.IsResourceExhausted(err) {
		t.Errorf("third lease of two uids: %v", err)
	}
	a.release()
	c2, err := leaseUID(c)
	if err != nil || c2.uid != a.uid {
		t.Errorf("after release: %+v %v, want uid %d again", c2, err, a.uid)
	}
	b.release()
	c2.release()
}

func TestCopySparseKeepsHolesAndOwner(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src.ram"), filepath.Join(dir, "dst.ram")
	f, err := os.OpenFile(src, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(64 << 20)
	f.WriteAt([]byte("page at 1 MiB"), 1<<20)
	f.WriteAt([]byte("last page"), 64<<20-9)
	f.Close()
	if err := sparse.Copy(dst, src, 4242); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 4242 || st.Gid != 4242 || st.Mode&0o777 != 0o600 || st.Size != 64<<20 {
		t.Errorf("copy: uid %d gid %d mode %o size %d", st.Uid, st.Gid, st.Mode&0o777, st.Size)
	}
	if st.Blocks*512 > 4<<20 {
		t.Errorf("copy allocates %d bytes: holes were filled", st.Blocks*512)
	}
	if fileSHA256(dst) != fileSHA256(src) {
		t.Error("copy differs")
	}
	if err := sparse.Copy(dst+"2", dir, -1); err == nil {
		t.Error("copied a directory")
	}
}

// TestLeaseUIDReclaimsDeadHoldersFiles: a holder that died (its lock file
// closed) without giving its RAM file back to root leaves it named in the
// lock file; the next holder of the uid chowns it to root before QEMU of
// that uid can run, and leaves alone what the uid no longer owns.
func TestLeaseUIDReclaimsDeadHoldersFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := t.TempDir()
	c := Confinement{UIDBase: 4100, UIDCount: 1, LockDir: filepath.Join(dir, "uids")}
	ram, other := filepath.Join(dir, "a.ram"), filepath.Join(dir, "b.ram")
	for _, p := range []string{ram, other} {
		if err := os.WriteFile(p, []byte("guest secrets"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, err := leaseUID(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.own(ram, other, "relative.ram"); err != nil {
		t.Fatal(err)
	}
	os.Chown(ram, a.uid, a.uid)
	os.Chown(other, 4242, 4242) // no longer the uid's: not touched
	a.release()                 // the shim died before disownFiles

	b, err := leaseUID(c)
	if err != nil {
		t.Fatal(err)
	}
	defer b.release()
	owner := func(p string) uint32 {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid
	}
	if u := owner(ram); u != 0 {
		t.Errorf("the dead holder's ram file is still owned by %d, want root", u)
	}
	if u := owner(other); u != 4242 {
		t.Errorf("a file the uid no longer owned was changed to %d", u)
	}
	if rec, _ := os.ReadFile(filepath.Join(c.LockDir, "4100")); string(rec) != "null" {
		t.Errorf("the new holder's record is %q, want it emptied", rec)
	}
}
