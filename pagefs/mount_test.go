package pagefs

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// asUID runs fn on a thread whose filesystem uid is uid (what FUSE reports
// as the caller). The thread is not reused: it ends with the goroutine.
func asUID(t *testing.T, uid int, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with us
		if err := syscall.Setfsuid(uid); err != nil {
			t.Errorf("setfsuid %d: %v", uid, err)
			return
		}
		fn()
	}()
	<-done
}

// TestMountAdmitsOnlyAllowedUIDs: pagefs itself refuses to open or change
// a served file for any uid but root and the allowed ones, whatever the
// directories above the mount allow; Allow admits a uid later.
func TestMountAdmitsOnlyAllowedUIDs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting pagefs needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	const admitted, stranger = 61234, 61235
	base, data := baseFile(t, 128<<10)
	// Open to all above the mount: only pagefs may refuse.
	dir, err := os.MkdirTemp("", "pagefs-acl-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := Mount(mnt, []*File{NewReadOnly("ram", base)}, Options{AllowUIDs: []uint32{admitted}})
	if err != nil {
		t.Skipf("mount: %v", err)
	}
	defer srv.Unmount()
	path := srv.Path("ram")

	read := func() error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		b := make([]byte, PageSize)
		if _, err := f.ReadAt(b, 0); err != nil {
			return err
		}
		if string(b) != string(data[:PageSize]) {
			return errors.New("wrong content")
		}
		return nil
	}
	if err := read(); err != nil {
		t.Fatalf("root: %v", err)
	}
	asUID(t, stranger, func() {
		if err := read(); !errors.Is(err, syscall.EACCES) {
			t.Errorf("uid %d opened the served file: %v; want EACCES", stranger, err)
		}
		if err := os.Truncate(path, int64(len(data))); !errors.Is(err, syscall.EACCES) {
			t.Errorf("uid %d changed the served file: %v; want EACCES", stranger, err)
		}
	})
	asUID(t, admitted, func() {
		if err := read(); err != nil {
			t.Errorf("allowed uid %d: %v", admitted, err)
		}
	})
	srv.Allow(stranger)
	asUID(t, stranger, func() {
		if err := read(); err != nil {
			t.Errorf("uid %d after Allow: %v", stranger, err)
		}
	})
}
