//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/integration/harness"
)

// TestLazyPrefetchBadChunk (issue #22 item 8): the largest blob of a
// file:// snapshot has one byte flipped, or is cut short, before a lazy
// restore from an empty node cache. The guest runs (it does not touch that
// chunk), the prefetch meets the blob and stops the sandbox within
// seconds: the exec running in it ends with the reason (the chunk's digest
// and the store), the task stops, the shim log names the chunk.
func TestLazyPrefetchBadChunk(t *testing.T) {
	e := harness.Start(t, lazyNode)
	startWorkload(t, e, "src")
	bigFile(t, e, "src") // 40 MiB of random data: the largest chunks
	cases := []struct {
		name string
		bad  func([]byte) []byte
	}{
		{"flip", func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }},
		{"cut", func(b []byte) []byte { return b[:len(b)/2] }},
	}
	for _, tc := range cases {
		checkpoint(t, e, "src", e.StoreURL(tc.name+":v1"))
	}
	e.MustCtr("task", "kill", "-s", "SIGKILL", "src")
	waitStopped(t, e, "src")
	e.MustCtr("task", "delete", "src")
	e.MustCtr("c", "rm", "src")
	touched := touchedBlobs(t, e, e.StoreURL(cases[0].name+":v1"))

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clearNodeCache(t, e)
			blobs, _ := filepath.Glob(filepath.Join(e.Dir, "store", tc.name, "blobs", "sha256", "*"))
			var victim string
			var size int64
			for _, p := range blobs {
				if touched[filepath.Base(p)] {
					continue // the guest reads it: the page path, not the prefetch, would meet it
				}
				if st, err := os.Stat(p); err == nil && st.Size() > size {
					victim, size = p, st.Size()
				}
			}
			if victim == "" {
				t.Fatal("no blob in the store")
			}
			b, err := os.ReadFile(victim)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(victim, tc.bad(b), 0o644); err != nil {
				t.Fatal(err)
			}
			digest := filepath.Base(victim)
			t.Logf("%s: blob %s of %d bytes", tc.name, digest, size)

			id := "lz-" + tc.name
			url := e.StoreURL(tc.name + ":v1")
			start := time.Now()
			args := append([]string{"-d", "--annotation", "cryo.dev/restore-from=" + url}, lazyMode)
			out, errs, err := e.Ctr(e.RunArgs(append(args, harness.Image, id, "sh", "-c", "echo booted-cold; sleep 1000")...)...)
			var reason string
			started := err == nil
			if !started {
				// The prefetch stopped the VM before the task started.
				reason = vmStopReason(t, out, errs, err)
			} else {
				out, errs, err = e.Ctr("task", "exec", "--exec-id", "wait", id, "sleep", "300")
				reason = vmStopReason(t, out, errs, err)
			}
			took := time.Since(start)
			t.Logf("%s: stopped %s after the restore began: %s", tc.name, took.Round(time.Millisecond), reason)
			if !strings.Contains(reason, digest) || !strings.Contains(reason, "from file://") {
				t.Fatalf("the reason %q names neither the bad chunk %s nor its store", reason, digest)
			}
			// The prefetch waits up to 2 s for the guest's first request,
			// then fetches 40-odd MiB from a local store.
			if took > 45*time.Second {
				t.Fatalf("the sandbox stopped %s after its restore began: not within seconds", took)
			}
			waitShimLog(t, e, regexp.MustCompile(`the vm stops.*`+digest), 10*time.Second)
			if started {
				waitStopped(t, e, id)
				e.MustCtr("task", "delete", id)
			} // else the create failed: there is no task
			e.MustCtr("c", "rm", id)
		})
	}
	noLeftovers(t, e)
	noLazyLeftovers(t, e)
}

// touchedBlobs restores url lazily without prefetch, lets the guest run
// and answer, and returns the blobs it read (the node cache's): the
// chunks a restore touches without a prefetch. Both snapshots of the test
// hold the same blobs.
func touchedBlobs(t *testing.T, e *harness.Env, url string) map[string]bool {
	t.Helper()
	c := e.Cfg
	c.Restore.PrefetchWorkers = 0
	e.WriteConfig(e.ConfigPath, c)
	defer e.WriteConfig(e.ConfigPath, e.Cfg)
	clearNodeCache(t, e)
	restore(t, e, "probe", url, lazyMode)
	readState(t, e, "probe")
	e.MustCtr("task", "exec", "--exec-id", "probe", "probe", "sleep", "3")
	e.MustCtr("task", "kill", "-s", "SIGKILL", "probe")
	waitStopped(t, e, "probe")
	cached, _ := filepath.Glob(filepath.Join(e.Cfg.Snapshot.CacheDir, "blobs", "blobs", "sha256", "*"))
	e.MustCtr("task", "delete", "probe")
	e.MustCtr("c", "rm", "probe")
	out := map[string]bool{}
	for _, p := range cached {
		out[filepath.Base(p)] = true
	}
	t.Logf("the guest touched %d blobs without prefetch", len(out))
	return out
}
