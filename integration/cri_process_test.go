//go:build integration

package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestCRIProcessAsUnderRunc: what a container's process gets as under
// runc. Every byte of an exec's stdin arrives before its EOF (kubectl cp,
// exec -i < file: the client closes its writer and CloseIO at once); its
// rlimits are containerd's (NOFILE 1024:524288), not the guest kernel's;
// a volume the kubelet made for a non-root user (an emptyDir 0777, a token
// 0600 of that user) is that user's in the guest too; and a missing
// executable is refused naming it.
func TestCRIProcessAsUnderRunc(t *testing.T) {
	c := harness.StartCRI(t)
	vol := filepath.Join(t.TempDir(), "vol")
	if err := os.MkdirAll(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "token"), []byte("user-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{vol, filepath.Join(vol, "token")} {
		if err := os.Chown(p, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	pcfg := c.PodConfig("proc", nil)
	pod := c.RunPod(pcfg)
	id := c.StartContainer(pod, c.ContainerConfig("app", []string{"sleep", "inf"}, map[string]any{
		"mounts": []map[string]any{{"container_path": "/data", "host_path": vol}},
		"linux":  map[string]any{"security_context": map[string]any{"run_as_user": map[string]any{"value": 1000}}},
	}), pcfg)

	const size = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := c.CrictlCmd(ctx, "exec", "-i", id, "wc", "-c")
	cmd.Stdin = bytes.NewReader(bytes.Repeat([]byte("x"), size))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil || strings.TrimSpace(out.String()) != "1048576" {
		t.Errorf("exec -i wc -c of %d bytes: %q %v %s; want every byte before EOF", size, out.String(), err, errb.String())
	}

	if got := execOut(t, c, id, "sh", "-c", "ulimit -n; ulimit -Hn"); got != "1024\n524288" {
		t.Errorf("ulimit -n, -Hn: %q, want containerd's 1024 and 524288", got)
	}

	if got := execOut(t, c, id, "sh", "-c", "id -u; cat /data/token; echo; echo hi > /data/new && cat /data/new"); got != "1000\nuser-token\nhi" {
		t.Errorf("user 1000 with a volume made for it: %q, want it to read its token and write the directory", got)
	}

	// A process that cannot start is refused naming it. (containerd's CRI
	// creates the task at StartContainer, so the start fails, as under
	// runc; the agent fails the task's create, as runc does for ctr.)
	bad := c.MustCrictl("create", pod, c.ContainerConfig("bad", []string{"/no/such/binary"}, nil), pcfg)
	if out, errs, err := c.Crictl("start", bad); err == nil || !strings.Contains(errs, "/no/such/binary") || !strings.Contains(errs, "no such file") {
		t.Errorf("start of a container whose executable is missing: %v %q %q; want a refusal naming it", err, out, errs)
	}
}
