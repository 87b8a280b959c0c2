package guest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestCopiedMountModesOwners: a copied directory mount is written with the
// host's modes and owners (an emptyDir's 0777, an fsGroup's setgid group,
// a token 0600 of the pod's user), an empty directory included, and files
// outside any mount keep theirs; directories that belong to no copied
// mount are dropped.
func TestCopiedMountModesOwners(t *testing.T) {
	spec := &specs.Spec{Process: &specs.Process{Args: []string{"x"}}, Mounts: []specs.Mount{
		{Destination: "/data", Type: "bind", Source: "/host/vol", Options: []string{"rbind"}},
	}}
	files := []fileEntry{
		{Path: "/data", Mode: 0o2777, UID: 1000, GID: 2000, Dir: true},
		{Path: "/data/empty", Mode: 0o1733, UID: 1000, GID: 2000, Dir: true},
		{Path: "/data/sub", Mode: 0o500, UID: 1000, GID: 2000, Dir: true},
		{Path: "/data/sub/token", Content: []byte("t"), Mode: 0o600, UID: 1000, GID: 2000},
		{Path: "/elsewhere", Mode: 0o777, Dir: true},
	}
	cfg, _, err := translateSpec(spec, "/r", files)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Files) != 0 || len(cfg.Mounts) != 1 || len(cfg.Mounts[0].Copy.Files) != 4 {
		t.Fatalf("files %+v, mounts %+v: want the four entries in the mount's copy and nothing else", cfg.Files, cfg.Mounts)
	}
	base := filepath.Join(t.TempDir(), "data")
	if err := writeCopy(base, cfg.Mounts[0]); err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]struct {
		mode     uint32
		uid, gid uint32
	}{
		"":          {0o2777 | syscall.S_IFDIR, 1000, 2000},
		"empty":     {0o1733 | syscall.S_IFDIR, 1000, 2000},
		"sub":       {0o500 | syscall.S_IFDIR, 1000, 2000},
		"sub/token": {0o600 | syscall.S_IFREG, 1000, 2000},
	} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(base, rel), &st); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if st.Mode != want.mode || st.Uid != want.uid || st.Gid != want.gid {
			t.Errorf("/data/%s: mode %o owner %d:%d, want %o %d:%d", rel, st.Mode, st.Uid, st.Gid, want.mode, want.uid, want.gid)
		}
	}
	if b, err := os.ReadFile(filepath.Join(base, "sub", "token")); err != nil || string(b) != "t" {
		t.Errorf("token: %q %v", b, err)
	}
}
