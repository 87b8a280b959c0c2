//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestRestoreRefused: a restore that must not happen fails the task create
// with the reason, and leaves no QEMU, no sandbox state, no disks; with
// restore-fallback cold the container boots instead.
//
// The node restores eagerly: a bad chunk is then refused before the VM
// starts (TestLazyCorruptChunk is the lazy counterpart).
func TestRestoreRefused(t *testing.T) {
	e := harness.Start(t, eagerNode, func(c *configs.Config) {
		c.Stores.Allowed = append(c.Stores.Allowed, "s3://down/")
		c.Stores.S3 = configs.S3{Endpoint: "127.0.0.1:9", AccessKey: "x", SecretKey: "y"}
	})
	startWorkload(t, e, "src")
	checkpoint(t, e, "src", e.StoreURL("good:v1"))
	checkpoint(t, e, "src", e.StoreURL("bad:v1"))
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")
	e.MustCtr("task", "delete", "src")
	e.MustCtr("c", "rm", "src")
	tamper(t, filepath.Join(e.Dir, "store", "bad"))

	other := func(name string, mutate func(*configs.Config)) string {
		c := e.Cfg
		mutate(&c)
		p := filepath.Join(e.Dir, name+".toml")
		e.WriteConfig(p, c)
		return p
	}
	for _, tc := range []struct {
		name, from, config string
		extra              []string
		want               string
	}{
		{name: "tampered blob", from: e.StoreURL("bad:v1"), want: "digest"},
		{name: "machine type", from: e.StoreURL("good:v1"), config: other("machine", func(c *configs.Config) { c.Hypervisor.MachineType = "pc-q35-7.1" }), want: "MachineType"},
		{name: "cpu model", from: e.StoreURL("good:v1"), config: other("cpu", func(c *configs.Config) { c.Hypervisor.CPUModel = "max" }), want: "CPUModel"},
		{name: "not allowed", from: "file:///etc/cryo-not-allowed:v1", want: "not under any of the node's allowed stores"},
		{name: "escape", from: "file://" + e.Dir + "/store/../../../etc/x:v1", want: "relative path segments"},
		{name: "unknown annotation", from: e.StoreURL("good:v1"), extra: []string{"--annotation", "cryo.dev/kernel=/tmp/evil"}, want: "unknown cryo annotation"},
		{name: "store down", from: "s3://down/x:v1", want: "127.0.0.1:9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "r-" + strings.ReplaceAll(tc.name, " ", "-")
			cfg := e.ConfigPath
			if tc.config != "" {
				cfg = tc.config
			}
			args := []string{"run", "-d", "--runtime", harness.Runtime, "--runtime-config-path", cfg, "--annotation", "cryo.dev/restore-from=" + tc.from}
			args = append(append(args, tc.extra...), harness.Image, id, "sh", "-c", "sleep 1000")
			out, errs, err := e.Ctr(args...)
			if err == nil {
				t.Fatalf("restore from %s succeeded: %s", tc.from, out)
			}
			if !strings.Contains(errs, tc.want) {
				t.Fatalf("error does not say %q:\n%s", tc.want, errs)
			}
			e.MustCtr("c", "rm", id)
			noLeftovers(t, e)
			noDisks(t, e)
		})
	}

	// The same failures with restore-fallback: cold boot the container.
	for _, from := range []string{e.StoreURL("bad:v1"), "s3://down/x:v1"} {
		e.MustCtr(e.RunArgs("--rm", "--annotation", "cryo.dev/restore-from="+from, "--annotation", "cryo.dev/restore-fallback=cold",
			harness.Image, "cold", "sh", "-c", "echo booted-cold")...)
		noLeftovers(t, e)
	}
	out := e.MustCtr(e.RunArgs("--rm", "--annotation", "cryo.dev/restore-from="+e.StoreURL("bad:v1"), "--annotation", "cryo.dev/restore-fallback=cold",
		harness.Image, "cold2", "sh", "-c", "echo booted-cold")...)
	if !strings.Contains(out, "booted-cold") {
		t.Fatalf("cold fallback output %q", out)
	}
	// The good snapshot still restores.
	restore(t, e, "ok", e.StoreURL("good:v1"))
}

// tamper flips one byte in the largest blob of an OCI layout.
func tamper(t *testing.T, layout string) {
	t.Helper()
	blobs, _ := filepath.Glob(filepath.Join(layout, "blobs", "sha256", "*"))
	var biggest string
	var size int64
	for _, b := range blobs {
		if st, err := os.Stat(b); err == nil && st.Size() > size {
			biggest, size = b, st.Size()
		}
	}
	if biggest == "" {
		t.Fatalf("no blobs in %s", layout)
	}
	f, err := os.OpenFile(biggest, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, size/2); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, size/2); err != nil {
		t.Fatal(err)
	}
}

func noDisks(t *testing.T, e *harness.Env) {
	t.Helper()
	if ents, err := os.ReadDir(filepath.Join(e.Dir, "disks")); err == nil && len(ents) > 0 {
		t.Fatalf("leftover sandbox disk dirs: %d", len(ents))
	}
	tmp, _ := filepath.Glob(filepath.Join(e.Dir, "cache", "snapshots", ".*tmp*"))
	if len(tmp) > 0 {
		t.Fatalf("partial cache entries left: %v", tmp)
	}
}
