package safefs

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// hostile builds a directory with every kind of entry a hostile writer
// can leave, and a secret outside it.
func hostile(t *testing.T) (dir, secret string) {
	t.Helper()
	parent := t.TempDir()
	secret = filepath.Join(parent, "secret")
	os.WriteFile(secret, []byte("host secret"), 0o600)
	dir = filepath.Join(parent, "dir")
	os.MkdirAll(filepath.Join(dir, "sub"), 0o700)
	os.WriteFile(filepath.Join(dir, "sub", "file"), []byte("ok"), 0o600)
	os.Symlink(secret, filepath.Join(dir, "abs-link"))
	os.Symlink("../secret", filepath.Join(dir, "rel-link"))
	os.Symlink("sub/file", filepath.Join(dir, "inside-link"))
	os.Symlink("sub", filepath.Join(dir, "dir-link"))
	os.Symlink(parent, filepath.Join(dir, "out"))
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return dir, secret
}

func TestRefusals(t *testing.T) {
	for _, walk := range []bool{false, true} {
		t.Run(map[bool]string{false: "openat2", true: "walk"}[walk], func(t *testing.T) {
			if walk {
				noOpenat2.Store(true)
				t.Cleanup(func() { noOpenat2.Store(false) })
			}
			dir, _ := hostile(t)
			d, err := OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if b, err := d.ReadFile("sub/file", 10); err != nil || string(b) != "ok" {
				t.Fatalf("sub/file: %q, %v", b, err)
			}
			for _, name := range []string{
				"abs-link", "rel-link", "inside-link", "dir-link/file", "out/secret",
				"fifo", "sock", "sub", "../secret", "/etc/passwd", "sub/../../secret", "sub/./file",
			} {
				done := make(chan error, 1)
				go func() {
					f, err := d.Open(name)
					if err == nil {
						f.Close()
					}
					done <- err
				}()
				select {
				case err := <-done:
					if !errors.Is(err, ErrUnsafe) || !errdefs.IsInvalidArgument(err) {
						t.Errorf("open %s: %v, want a refusal", name, err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("open %s blocked", name)
				}
			}
			if _, err := d.Open("missing"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("missing: %v", err)
			}
			if _, err := d.MkdirAll("dir-link/new", 0o700); !errors.Is(err, ErrUnsafe) {
				t.Errorf("mkdir through a symlink: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, "sub", "new")); err == nil {
				t.Error("mkdir followed the symlink")
			}
			if _, err := d.OpenFile("out/created", os.O_CREATE|os.O_WRONLY, 0o600); !errors.Is(err, ErrUnsafe) {
				t.Errorf("create through a symlink: %v", err)
			}
			if fi, err := d.Lstat("abs-link"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("lstat abs-link: %v, %v", fi, err)
			}
			if err := d.Remove("abs-link"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestReadFileLimit(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "big"), make([]byte, 100), 0o600)
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.ReadFile("big", 99); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("over the limit: %v", err)
	}
	if b, err := d.ReadFile("big", 100); err != nil || len(b) != 100 {
		t.Fatalf("at the limit: %d, %v", len(b), err)
	}
}

func TestMkdirAllNoFollow(t *testing.T) {
	parent := t.TempDir()
	target := t.TempDir()
	os.Symlink(target, filepath.Join(parent, "link"))
	if _, err := MkdirAllNoFollow(filepath.Join(parent, "link", "store")); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("through a symlink: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, "store")); err == nil {
		t.Fatal("created through the symlink")
	}
	d, err := MkdirAllNoFollow(filepath.Join(parent, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if st, err := os.Stat(filepath.Join(parent, "a", "b")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("created %v, %v", st, err)
	}
}
