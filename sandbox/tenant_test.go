package sandbox

import (
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/configs"
)

// TestStoreRedirectPolicy: a store a sandbox opens follows redirects only
// to where the allowlist lets that sandbox's namespace go, or within the
// registry of an oci:// store.
func TestStoreRedirectPolicy(t *testing.T) {
	cfg := configs.Default()
	cfg.Stores.Allowed = []string{"https://store.example/{namespace}/", "oci://reg.example:5000/{namespace}/"}
	for _, tc := range []struct {
		store, to string
		ok        bool
	}{
		{"https://store.example/team-a/x:v1", "https://store.example/team-a/y/index.json", true},
		{"https://store.example/team-a/x:v1", "https://store.example/team-b/x/index.json", false},
		{"https://store.example/team-a/x:v1", "https://internal.example/metadata", false},
		{"oci://reg.example:5000/team-a/x:v1", "https://reg.example:5000/v2/team-a/x/blobs/sha256:ab", true},
		{"oci://reg.example:5000/team-a/x:v1", "https://cdn.example/blob", false},
	} {
		o := storeOptions(cfg.Stores, "team-a", tc.store, false)
		u, _ := url.Parse(tc.to)
		err := o.Redirect(u)
		if tc.ok != (err == nil) {
			t.Errorf("%s -> %s: %v, want ok=%v", tc.store, tc.to, err, tc.ok)
		}
		if err != nil && !errdefs.IsPermissionDenied(err) {
			t.Errorf("%s -> %s: %v is not permission denied", tc.store, tc.to, err)
		}
		if strings.Contains(tc.to, "team-b") && (err == nil || !strings.Contains(err.Error(), `"team-b"`) || !strings.Contains(err.Error(), `"team-a"`)) {
			t.Errorf("cross-namespace redirect: %v, want both namespaces named", err)
		}
	}
	if o := storeOptions(cfg.Stores, "team-a", "file:///ckpt/snapshot/cryo:checkpoint", true); o.Redirect != nil {
		t.Error("a store the shim chose itself got a redirect policy")
	}
}

// TestCheckpointRefusalLeavesNoStore: a checkpoint refused for a missing
// namespace key (or a target without a reference) is refused before the
// store is opened, so a file:// target's layout is never created.
func TestCheckpointRefusalLeavesNoStore(t *testing.T) {
	root := t.TempDir()
	cfg := configs.Default()
	cfg.Stores.Allowed = []string{"file://" + root + "/{namespace}/"}
	keyless := cfg
	keyless.Snapshot.EncryptionKeyDir = t.TempDir() // holds no key for team-a
	for _, tc := range []struct {
		cfg      configs.Config
		to, want string
	}{
		{keyless, "file://" + root + "/team-a/agent:v1", "encryption_key_dir"},
		{cfg, "file://" + root + "/team-a/agent", "names no reference"},
	} {
		sb := &Sandbox{spec: Spec{ID: "sb1", Node: testNode(t, tc.cfg), Tenant: "team-a"}}
		c := &checkpointing{sb: sb, req: CheckpointRequest{To: tc.to}}
		err := c.target(t.Context(), &undo{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("checkpoint to %s: %v, want a refusal naming %q", tc.to, err, tc.want)
		}
		if ents, _ := os.ReadDir(root); len(ents) != 0 {
			t.Errorf("checkpoint to %s refused, but the store root holds %v", tc.to, ents)
		}
	}
}
