//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/snapshot"
)

// TestCRITenantIsolation: with a [stores] allowed entry per namespace, a
// pod of namespace team-a checkpoints into team-a's store and another
// team-a pod restores from it; a pod of team-b is refused, through CRI,
// both when it asks to restore team-a's snapshot and when it checkpoints
// to team-a's store, and each refusal names both namespaces. The refused
// checkpoint leaves team-a's tag as it was.
func TestCRITenantIsolation(t *testing.T) {
	c := harness.StartCRI(t, func(cfg *configs.Config) {
		cfg.Stores.Allowed = []string{strings.TrimSuffix(cfg.Stores.Allowed[0], "/") + "/" + configs.NamespacePlaceholder + "/"}
	})
	storeA := c.StoreURL("team-a/agent:v1")
	indexA := filepath.Join(c.Dir, "store", "team-a", "agent", "index.json")

	srcCfg := c.PodConfigIn("team-a", "src", map[string]string{"cryo.dev/checkpoint-to": storeA})
	src := c.RunPod(srcCfg)
	app := c.StartContainer(src, c.ContainerConfig("app", []string{"sh", "-c", "echo a > /dev/shm/owner; exec sleep inf"}, nil), srcCfg)
	c.MustCrictl("checkpoint", "--export="+filepath.Join(c.Dir, "a.tar"), app)
	before, err := os.ReadFile(indexA)
	if err != nil {
		t.Fatalf("team-a's checkpoint left no store index: %v", err)
	}

	// team-b asks for team-a's snapshot.
	thiefCfg := c.PodConfigIn("team-b", "thief", map[string]string{"cryo.dev/restore-from": storeA})
	out, errs, err := c.Crictl("runp", "--runtime", harness.RuntimeHandler, thiefCfg)
	if err == nil {
		t.Fatalf("a team-b pod restored team-a's snapshot: pod %s", strings.TrimSpace(out))
	}
	mustNameBoth(t, "restore", errs)

	// team-b checkpoints to team-a's store.
	bCfg := c.PodConfigIn("team-b", "writer", map[string]string{"cryo.dev/checkpoint-to": storeA})
	bPod := c.RunPod(bCfg)
	bApp := c.StartContainer(bPod, c.ContainerConfig("bapp", []string{"sleep", "inf"}, nil), bCfg)
	_, errs, err = c.Crictl("checkpoint", "--export="+filepath.Join(c.Dir, "b.tar"), bApp)
	if err == nil {
		t.Fatal("a team-b pod checkpointed into team-a's store")
	}
	mustNameBoth(t, "checkpoint", errs)
	if after, _ := os.ReadFile(indexA); string(after) != string(before) {
		t.Fatalf("the refused checkpoint changed team-a's store index:\nbefore %s\nafter  %s", before, after)
	}

	// The snapshot itself is fine: team-a restores it.
	dstCfg := c.PodConfigIn("team-a", "dst", map[string]string{"cryo.dev/restore-from": storeA})
	dst := c.RunPod(dstCfg)
	dapp := c.StartContainer(dst, c.ContainerConfig("app", []string{"sh", "-c", "echo this-never-runs"}, nil), dstCfg)
	if got := strings.TrimSpace(execOut(t, c, dapp, "cat", "/dev/shm/owner")); got != "a" {
		t.Fatalf("team-a's restored pod: /dev/shm/owner = %q", got)
	}
	for _, p := range []string{src, bPod, dst} {
		c.MustCrictl("stopp", p)
		c.MustCrictl("rmp", p)
	}
	if !harness.WaitFor(20*time.Second, func() bool { return len(c.QEMUPids()) == 0 }) {
		t.Fatalf("QEMU left after rmp: %v", c.QEMUPids())
	}
}

func mustNameBoth(t *testing.T, what, errs string) {
	t.Helper()
	t.Logf("refused %s: %s", what, strings.TrimSpace(errs))
	// crictl may escape the quotes of the shim's message.
	if !strings.Contains(errs, `belongs to namespace \"team-a\"`) && !strings.Contains(errs, `belongs to namespace "team-a"`) || !strings.Contains(errs, "team-b") {
		t.Fatalf("refused %s: the error does not name both namespaces: %s", what, errs)
	}
}

// TestCRINamespaceKeys: with a key per namespace, a snapshot that team-a
// checkpoints into a node-wide store is encrypted with team-a's key; a
// team-b pod that names it is refused (its key is another), team-a restores
// it.
func TestCRINamespaceKeys(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.Mkdir(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if err := snapshot.GenerateEncryptionKey(filepath.Join(keys, ns)); err != nil {
			t.Fatal(err)
		}
	}
	c := harness.StartCRI(t, func(cfg *configs.Config) { cfg.Snapshot.EncryptionKeyDir = keys })
	sealedPerTenant(t, c)
}

// TestCRINodeKeyTenants: with one node-wide encryption_key, each namespace
// seals with its own key derived from it: a team-b pod that names team-a's
// snapshot is refused (the snapshot is sealed for team-a, and team-b's
// derived key would not open it), team-a restores it.
func TestCRINodeKeyTenants(t *testing.T) {
	key := filepath.Join(t.TempDir(), "node.key")
	if err := snapshot.GenerateEncryptionKey(key); err != nil {
		t.Fatal(err)
	}
	c := harness.StartCRI(t, func(cfg *configs.Config) { cfg.Snapshot.EncryptionKey = key })
	sealedPerTenant(t, c)
}

// sealedPerTenant: team-a checkpoints into a node-wide store; a team-b pod
// that names the snapshot is refused as sealed for team-a, and team-a
// restores it.
func sealedPerTenant(t *testing.T, c *harness.CRI) {
	t.Helper()
	shared := c.StoreURL("shared:v1")

	srcCfg := c.PodConfigIn("team-a", "src", map[string]string{"cryo.dev/checkpoint-to": shared})
	src := c.RunPod(srcCfg)
	app := c.StartContainer(src, c.ContainerConfig("app", []string{"sh", "-c", "echo a > /dev/shm/owner; exec sleep inf"}, nil), srcCfg)
	c.MustCrictl("checkpoint", "--export="+filepath.Join(c.Dir, "a.tar"), app)

	thiefCfg := c.PodConfigIn("team-b", "thief", map[string]string{"cryo.dev/restore-from": shared})
	if out, errs, err := c.Crictl("runp", "--runtime", harness.RuntimeHandler, thiefCfg); err == nil || !strings.Contains(errs, `sealed for namespace \"team-a\"`) && !strings.Contains(errs, `sealed for namespace "team-a"`) {
		t.Fatalf("a team-b pod restoring team-a's snapshot: pod %q, err %v\n%s", strings.TrimSpace(out), err, errs)
	} else {
		t.Logf("refused: %s", strings.TrimSpace(errs))
	}

	dstCfg := c.PodConfigIn("team-a", "dst", map[string]string{"cryo.dev/restore-from": shared})
	dst := c.RunPod(dstCfg)
	dapp := c.StartContainer(dst, c.ContainerConfig("app", []string{"sh", "-c", "echo this-never-runs"}, nil), dstCfg)
	if got := strings.TrimSpace(execOut(t, c, dapp, "cat", "/dev/shm/owner")); got != "a" {
		t.Fatalf("team-a's restored pod: /dev/shm/owner = %q", got)
	}
	for _, p := range []string{src, dst} {
		c.MustCrictl("stopp", p)
		c.MustCrictl("rmp", p)
	}
}
