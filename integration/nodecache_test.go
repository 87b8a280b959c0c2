//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/annotations"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/stack"
	"github.com/cryo-runtime/cryo/stores"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// TestNodeCacheTenants: two namespaces (tenants) on one node share its
// cache, each with its own stores (team-a an S3 prefix of a real
// versitygw, team-b a file store and an S3 prefix of its own).
//
//   - team-a's store is slow (tc-shaped) while team-a restores its
//     snapshot; team-b restores the same snapshot from its own store
//     meanwhile and is not held up by team-a's downloads or its
//     materialization (locks per store and digest, per store and
//     manifest).
//   - team-b then publishes, in its S3 prefix, a manifest naming team-a's
//     blobs without the blobs: its restore is refused, although the node
//     has every blob cached and the snapshot materialized.
func TestNodeCacheTenants(t *testing.T) {
	s3 := storetest.StartS3(t)
	e := harness.Start(t, s3Node(s3), eagerNode)
	ctx := context.Background()
	open := func(u string) stores.Store {
		t.Helper()
		s, _, err := stores.Open(ctx, u, e.Cfg.Stores.FetchOptions())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	storeA := "s3://" + s3.Bucket + "/team-a/agent:v1"
	fileB := e.StoreURL("team-b/agent:v1")
	s3B := "s3://" + s3.Bucket + "/team-b/agent:v1"
	as := func(ns string) string { return "--annotation=" + annotations.CRISandboxNamespace + "=" + ns }

	e.MustCtr(e.RunArgs("-d", as("team-a"), harness.Image, "src", "sh", "-c", "echo a > /dev/shm/owner; exec sleep inf")...)
	if !harness.WaitFor(60*time.Second, func() bool {
		out, _, err := e.Ctr("task", "exec", "--exec-id", "probe"+strconv.Itoa(int(time.Now().UnixNano()%1e6)), "src", "cat", "/dev/shm/owner")
		return err == nil && strings.TrimSpace(out) == "a"
	}) {
		t.Fatal("src did not write its owner")
	}
	checkpoint(t, e, "src", storeA)

	a := open(storeA)
	root, err := a.Resolve(ctx, "v1")
	if err != nil {
		t.Fatal(err)
	}
	// team-b's own copy of the same snapshot.
	b := open(fileB)
	if err := stores.Copy(ctx, a, b, root); err != nil {
		t.Fatal(err)
	}
	if err := b.Tag(ctx, root, "v1"); err != nil {
		t.Fatal(err)
	}

	// team-a restores through a slow link; team-b restores meanwhile.
	link, err := stack.ShapeEndpoint(s3.Endpoint, "1mbit")
	if err != nil {
		t.Fatal(err)
	}
	defer link.Remove()
	type done struct {
		at  time.Time
		err error
		out string
	}
	aDone := make(chan done, 1)
	t0 := time.Now()
	go func() {
		out, errs, err := e.Ctr(e.RunArgs("-d", as("team-a"), "--annotation", "cryo.dev/restore-from="+storeA, harness.Image, "a1", "sh", "-c", "echo booted-cold; sleep 1000")...)
		aDone <- done{time.Now(), err, strings.TrimSpace(out + errs)}
	}()
	lockGlob := filepath.Join(e.Cfg.Snapshot.CacheDir, "snapshots", "."+root.Digest.Encoded()+"*.lock")
	if !harness.WaitFor(90*time.Second, func() bool { m, _ := filepath.Glob(lockGlob); return len(m) > 0 }) {
		t.Fatalf("team-a's materialization never started (no %s)", lockGlob)
	}
	time.Sleep(2 * time.Second) // its downloads are under way
	e.MustCtr(e.RunArgs("-d", as("team-b"), "--annotation", "cryo.dev/restore-from="+fileB, harness.Image, "b1", "sh", "-c", "echo booted-cold; sleep 1000")...)
	bAt := time.Now()
	shaped, _ := link.Bytes()
	t.Logf("team-b restored after %s while team-a's store was slow (%d bytes through its link so far)", bAt.Sub(t0), shaped)
	select {
	case d := <-aDone:
		t.Fatalf("team-a's slow restore ended (after %s, err %v: %s) before team-b's: team-b waited for team-a's store", d.at.Sub(t0), d.err, d.out)
	default:
	}
	out, _, err := e.Ctr("task", "exec", "--exec-id", "owner-b1", "b1", "cat", "/dev/shm/owner")
	if err != nil || strings.TrimSpace(out) != "a" {
		t.Fatalf("team-b's restored sandbox: /dev/shm/owner = %q, %v", out, err)
	}
	link.Remove()
	select {
	case d := <-aDone:
		// Cut at its deadline, or done once the link was freed.
		t.Logf("team-a's slow restore ended after %s: err %v: %s", d.at.Sub(t0), d.err, d.out)
	case <-time.After(5 * time.Minute):
		t.Fatal("team-a's restore did not end within its bound")
	}

	// team-b names team-a's blobs in a manifest of its own S3 prefix,
	// without holding them: the node has them cached and materialized.
	mb := readBlob(t, a, root)
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		t.Fatal(err)
	}
	thief := open(s3B)
	for _, d := range []ocispec.Descriptor{m.Config, root} {
		if err := thief.Push(ctx, d, bytes.NewReader(readBlob(t, a, d))); err != nil {
			t.Fatal(err)
		}
	}
	if err := thief.Tag(ctx, root, "v1"); err != nil {
		t.Fatal(err)
	}
	out, errs, err := e.Ctr(e.RunArgs("-d", as("team-b"), "--annotation", "cryo.dev/restore-from="+s3B, harness.Image, "thief", "sh", "-c", "echo booted-cold; sleep 1000")...)
	if err == nil {
		t.Fatalf("team-b restored team-a's RAM from the node cache through a manifest naming blobs its store does not hold: %s", out)
	}
	t.Logf("refused: %s", strings.TrimSpace(errs))
	if !strings.Contains(errs, "not in the store") && !strings.Contains(errs, "not confirmed by this store") {
		t.Fatalf("refusal does not say the store lacks the blobs: %s", errs)
	}
}

func readBlob(t *testing.T, s stores.Store, d ocispec.Descriptor) []byte {
	t.Helper()
	rc, err := s.Fetch(context.Background(), d, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64<<20))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
