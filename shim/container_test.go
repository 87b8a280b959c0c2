package shim

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/sandbox"
)

func TestGuestFiles(t *testing.T) {
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	os.WriteFile(resolv, []byte("nameserver 10.0.0.10\n"), 0o644)
	secrets := filepath.Join(dir, "secrets")
	os.MkdirAll(filepath.Join(secrets, "..data"), 0o755)
	os.WriteFile(filepath.Join(secrets, "..data", "token"), []byte("t0ken"), 0o600)
	os.Symlink("..data/token", filepath.Join(secrets, "token"))
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, maxCopiedFile+1), 0o644)
	s := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"rbind", "ro"}},
		{Destination: "/var/run/secrets", Type: "bind", Source: secrets, Options: []string{"rbind", "ro"}},
		{Destination: "/big", Type: "bind", Source: big, Options: []string{"rbind"}},
		{Destination: "/missing", Source: filepath.Join(dir, "nope"), Options: []string{"bind"}},
		{Destination: "/dev/shm", Type: "bind", Source: "/run/containerd/sandbox/shm", Options: []string{"rbind"}},
	}}
	files := guestFiles(t.Context(), s)
	got := map[string]string{}
	for _, f := range files {
		got[f.Path] = string(f.Content)
	}
	if got["/etc/resolv.conf"] != "nameserver 10.0.0.10\n" || got["/var/run/secrets/token"] != "t0ken" || got["/var/run/secrets/..data/token"] != "t0ken" {
		t.Fatalf("copied files: %v", got)
	}
	if _, ok := got["/big"]; ok {
		t.Fatal("a file over the limit was copied")
	}
	// the copied mounts stay, with their options, for the guest to mount;
	// the one that could not be copied is gone
	var left []string
	for _, m := range s.Mounts {
		left = append(left, m.Destination+":"+strings.Join(m.Options, ","))
	}
	if !slices.Contains(left, "/var/run/secrets:rbind,ro") || slices.ContainsFunc(left, func(d string) bool { return strings.HasPrefix(d, "/big:") }) {
		t.Fatalf("mounts left in the spec: %q", left)
	}
}

// TestGuestFilesHostile: the host side of a bind mount, which other pods
// may write, cannot pull host files into the guest nor block the shim: a
// symlink out of the mount's tree, a FIFO, a socket or a device refuses
// the mount at once; one inside the tree is followed.
func TestGuestFilesHostile(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "host-secret")
	os.WriteFile(secret, []byte("root's secret"), 0o600)
	mk := func(name string, fill func(d string)) string {
		d := filepath.Join(dir, name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "ok"), []byte("ok"), 0o644)
		fill(d)
		return d
	}
	mounts := map[string]string{
		"/abs-link": mk("abs", func(d string) { os.Symlink(secret, filepath.Join(d, "x")) }),
		"/rel-link": mk("rel", func(d string) { os.Symlink("../host-secret", filepath.Join(d, "x")) }),
		"/deep-link": mk("deep", func(d string) {
			os.MkdirAll(filepath.Join(d, "a"), 0o755)
			os.Symlink("../../host-secret", filepath.Join(d, "a", "x"))
		}),
		"/dir-link": mk("dirlink", func(d string) { os.Symlink(dir, filepath.Join(d, "up")) }),
		"/fifo":     mk("fifo", func(d string) { syscall.Mkfifo(filepath.Join(d, "x"), 0o600) }),
		"/socket":   mk("socket", func(d string) { syscall.Mknod(filepath.Join(d, "x"), syscall.S_IFSOCK|0o600, 0) }),
		"/inside":   mk("inside", func(d string) { os.Symlink("ok", filepath.Join(d, "alias")) }),
	}
	fifo := filepath.Join(dir, "single-fifo")
	syscall.Mkfifo(fifo, 0o600)
	mounts["/single-fifo"] = fifo
	s := &specs.Spec{}
	for dst, src := range mounts {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dst, Type: "bind", Source: src})
	}
	done := make(chan []sandbox.GuestFile, 1)
	go func() { done <- guestFiles(t.Context(), s) }()
	var files []sandbox.GuestFile
	select {
	case files = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("guestFiles blocked")
	}
	got := map[string]string{}
	for _, f := range files {
		if f.Dir {
			continue
		}
		got[f.Path] = string(f.Content)
		if strings.Contains(string(f.Content), "secret") {
			t.Errorf("%s carries a host file into the guest", f.Path)
		}
	}
	want := map[string]string{"/inside/ok": "ok", "/inside/alias": "ok"}
	if len(got) != len(want) || got["/inside/ok"] != "ok" || got["/inside/alias"] != "ok" {
		t.Fatalf("copied %v, want %v", got, want)
	}
}

// TestGuestFilesOwners: a copied mount keeps its directories' modes and
// every entry's owner, as the kubelet made them for the pod's user: an
// emptyDir is 0777, an fsGroup volume setgid and the group's, a projected
// token 0600 and the user's.
func TestGuestFilesOwners(t *testing.T) {
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol")
	if err := os.MkdirAll(filepath.Join(vol, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(vol, "sub", "token"), []byte("t"), 0o600)
	for p, m := range map[string]os.FileMode{vol: 0o777 | os.ModeSetgid, filepath.Join(vol, "sub"): 0o750 | os.ModeSticky} {
		if err := os.Chmod(p, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{vol, filepath.Join(vol, "sub"), filepath.Join(vol, "sub", "token")} {
		if err := os.Lchown(p, 1000, 2000); err != nil {
			t.Fatalf("chown (the test runs as root): %v", err)
		}
	}
	s := &specs.Spec{Mounts: []specs.Mount{{Destination: "/data", Type: "bind", Source: vol, Options: []string{"rbind"}}}}
	got := map[string]sandbox.GuestFile{}
	for _, f := range guestFiles(t.Context(), s) {
		got[f.Path] = f
	}
	want := map[string]sandbox.GuestFile{
		"/data":           {Path: "/data", Mode: 0o777 | os.ModeSetgid, UID: 1000, GID: 2000, Dir: true},
		"/data/sub":       {Path: "/data/sub", Mode: 0o750 | os.ModeSticky, UID: 1000, GID: 2000, Dir: true},
		"/data/sub/token": {Path: "/data/sub/token", Content: []byte("t"), Mode: 0o600, UID: 1000, GID: 2000},
	}
	if len(got) != len(want) {
		t.Fatalf("copied %+v, want %+v", got, want)
	}
	for p, w := range want {
		g := got[p]
		if g.Mode != w.Mode || g.UID != w.UID || g.GID != w.GID || g.Dir != w.Dir || string(g.Content) != string(w.Content) {
			t.Errorf("%s: %+v, want %+v", p, g, w)
		}
	}
}
