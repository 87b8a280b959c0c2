package envd

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

func TestLookupUser(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"
	group := "root:x:0:\nuser:x:1000:\nwheel:x:10:user,other\n"
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte(passwd), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte(group), 0o644)

	u, err := lookupUser(root, "user")
	if err != nil || u.UID != 1000 || u.GID != 1000 || u.Home != "/home/user" || len(u.Groups) != 1 || u.Groups[0] != 10 {
		t.Fatalf("lookupUser(user) = %+v, %v", u, err)
	}
	if u, err := lookupUser(root, "0"); err != nil || u.Name != "root" {
		t.Fatalf("lookupUser(0) = %+v, %v", u, err)
	}
	if _, err := lookupUser(root, "nobody"); err == nil {
		t.Fatal("an unknown user was found")
	}
	if u, err := lookupUser(root, "4242"); err != nil || u.UID != 4242 {
		t.Fatalf("lookupUser(4242) = %+v, %v", u, err)
	}
}

// A container's /etc/passwd that is a symlink out of its root resolves
// inside the root, never to the agent's own file.
func TestLookupUserStaysInRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "passwd"), []byte("evil:x:0:0::/:/bin/sh\n"), 0o644)
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	if err := os.Symlink(filepath.Join(outside, "passwd"), filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	if _, err := lookupUser(root, "evil"); err == nil {
		t.Fatal("lookupUser followed a symlink out of the container's root")
	}
}

func TestRequestUser(t *testing.T) {
	r, _ := http.NewRequest("GET", "/", nil)
	if _, ok, err := requestUser(r); ok || err != nil {
		t.Fatalf("no header: ok %v err %v", ok, err)
	}
	r.SetBasicAuth("user", "")
	if name, ok, err := requestUser(r); !ok || err != nil || name != "user" {
		t.Fatalf("basic user: %q %v %v", name, ok, err)
	}
	r.Header.Set("Authorization", "Bearer x")
	if _, _, err := requestUser(r); err == nil {
		t.Fatal("a bearer header was accepted")
	}
}
