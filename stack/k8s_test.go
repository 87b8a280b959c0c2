package stack

import (
	"os"
	"path/filepath"
	"testing"
)

// removeLinksInto removes only the links that point into the control
// plane's own directory (the kubelet's /var/log/containers entries for its
// pods), never other files or links.
func TestRemoveLinksInto(t *testing.T) {
	dir, ours, other := t.TempDir(), t.TempDir(), t.TempDir()
	for name, target := range map[string]string{
		"ours.log":    filepath.Join(ours, "pod-logs", "a", "0.log"),
		"other.log":   filepath.Join(other, "b.log"),
		"prefix.log":  ours + "-not-ours/c.log",
		"regular.log": "",
	} {
		p := filepath.Join(dir, name)
		var err error
		if target == "" {
			err = os.WriteFile(p, nil, 0o600)
		} else {
			err = os.Symlink(target, p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	removeLinksInto(dir, ours)
	for name, want := range map[string]bool{"ours.log": false, "other.log": true, "prefix.log": true, "regular.log": true} {
		if _, err := os.Lstat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", name, err == nil, want)
		}
	}
}
