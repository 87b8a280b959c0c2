package guest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSecurePath(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755)
	os.Symlink("/usr/lib", filepath.Join(root, "lib"))        // absolute, inside
	os.Symlink("../../../../etc", filepath.Join(root, "esc")) // relative, tries to leave
	os.Symlink("/", filepath.Join(root, "usr/root"))
	os.Symlink("loop2", filepath.Join(root, "loop1"))
	os.Symlink("loop1", filepath.Join(root, "loop2"))
	for in, want := range map[string]string{
		"/etc/hosts":        "/etc/hosts",
		"/lib/x.so":         "/usr/lib/x.so",
		"/esc/passwd":       "/etc/passwd",
		"/../../etc":        "/etc",
		"/usr/root/etc":     "/etc",
		"/missing/a/b":      "/missing/a/b",
		"relative/path":     "/relative/path",
		"/usr/./lib/../lib": "/usr/lib",
	} {
		got, err := securePath(root, in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got != filepath.Join(root, want) {
			t.Errorf("%s -> %s, want %s", in, got, filepath.Join(root, want))
		}
	}
	if _, err := securePath(root, "/loop1/x"); err == nil {
		t.Error("symlink loop resolved")
	}
}
