//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestCRIReadonlyMounts: a CRI mount with readonly: true (how secrets,
// configMaps, the service-account token and image volumes arrive) cannot
// be written in the guest, a file or a directory, while a writable one
// can; the content is the host's.
func TestCRIReadonlyMounts(t *testing.T) {
	c := harness.StartCRI(t)
	host := filepath.Join(c.Dir, "volumes")
	for name, content := range map[string]string{"ro-dir/key": "secret-value", "ro-file": "file-value", "rw-dir/old": "old"} {
		os.MkdirAll(filepath.Dir(filepath.Join(host, name)), 0o755)
		if err := os.WriteFile(filepath.Join(host, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pcfg := c.PodConfig("mounts", nil)
	pod := c.RunPod(pcfg)
	id := c.StartContainer(pod, c.ContainerConfig("m", []string{"sleep", "inf"}, map[string]any{"mounts": []map[string]any{
		{"container_path": "/ro-dir", "host_path": filepath.Join(host, "ro-dir"), "readonly": true},
		{"container_path": "/etc/ro-file", "host_path": filepath.Join(host, "ro-file"), "readonly": true},
		{"container_path": "/rw-dir", "host_path": filepath.Join(host, "rw-dir")},
	}}), pcfg)

	if got := execOut(t, c, id, "cat", "/ro-dir/key", "/etc/ro-file"); got != "secret-valuefile-value" {
		t.Fatalf("content of the read-only mounts: %q", got)
	}
	for _, write := range []string{
		"echo x > /ro-dir/key", "echo x > /ro-dir/new", "rm /ro-dir/key", "echo x > /etc/ro-file", "chmod 777 /ro-dir/key",
	} {
		out, errs, err := c.Crictl("exec", id, "sh", "-c", write)
		if err == nil || !strings.Contains(out+errs, "Read-only file system") {
			t.Errorf("%q in a read-only mount: %v %q %q, want Read-only file system", write, err, out, errs)
		}
	}
	if got := execOut(t, c, id, "cat", "/ro-dir/key", "/etc/ro-file"); got != "secret-valuefile-value" {
		t.Fatalf("content of the read-only mounts after the writes: %q", got)
	}
	if got := execOut(t, c, id, "sh", "-c", "echo new > /rw-dir/new && echo more >> /rw-dir/old && cat /rw-dir/new /rw-dir/old"); got != "new\noldmore" {
		t.Fatalf("writes in the writable mount: %q", got)
	}
	mounts := execOut(t, c, id, "cat", "/proc/mounts")
	for _, m := range []string{"/ro-dir", "/etc/ro-file"} {
		if !hasMount(mounts, m, "ro") {
			t.Errorf("%s is not a read-only mount:\n%s", m, mounts)
		}
	}
	if !hasMount(mounts, "/rw-dir", "rw") {
		t.Errorf("/rw-dir is not a read-write mount:\n%s", mounts)
	}
}

// hasMount reports whether /proc/mounts content lists a mount at target
// whose options start with opt.
func hasMount(mounts, target, opt string) bool {
	for _, l := range strings.Split(mounts, "\n") {
		f := strings.Fields(l)
		if len(f) >= 4 && f[1] == target && strings.HasPrefix(f[3], opt+",") {
			return true
		}
	}
	return false
}
