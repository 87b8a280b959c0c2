//go:build integration

package main

import (
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/snapshot/archive"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// TestIntegrationRegistryToS3 moves a signed snapshot from a real registry
// through an export file into a real S3 server and uses it there.
func TestIntegrationRegistryToS3(t *testing.T) {
	e := newEnv(t)
	reg := storetest.StartRegistry(t)
	s3 := storetest.StartS3(t)
	src := "oci://" + reg + "/cryo/web"
	d := e.writeSnapshot(src, "v1", 9, true, time.Time{})
	s3flags := []string{"--s3-endpoint", s3.Endpoint, "--s3-access-key", s3.AccessKey, "--s3-secret-key", s3.SecretKey, "--s3-use-ssl", "false"}
	run := func(v any, args ...string) {
		t.Helper()
		e.runJSON(v, append(append(append([]string{}, s3flags...), "--verify-key", e.pub, "--require-signature"), args...)...)
	}

	var info snapshotInfo
	run(&info, "inspect", src+":v1")
	if info.Manifest != d.Digest || !info.Signed {
		t.Fatalf("inspect in registry = %+v", info)
	}
	var ex archive.Exported
	run(&ex, "export", src+":v1", e.dir+"/export")
	dst := "s3://" + s3.Bucket + "/cryo/web"
	var ir importResult
	run(&ir, "import", ex.Path, dst+":v1")
	if ir.Manifest != d.Digest || !ir.Signed || !ir.ChunksVerified {
		t.Fatalf("import to s3 = %+v", ir)
	}
	var vr verifyResult
	run(&vr, "verify", dst+":v1")
	if !vr.OK || vr.Manifest != d.Digest {
		t.Fatalf("verify in s3 = %+v", vr)
	}
	var ls []lsEntry
	run(&ls, "ls", dst)
	if len(ls) != 1 || ls[0].Tag != "v1" {
		t.Fatalf("ls s3 = %+v", ls)
	}
	var pr pullResult
	run(&pr, "pull", dst+":v1")
	if pr.Downloaded != pr.Bytes || pr.Blobs != 8 {
		t.Fatalf("pull from s3 = %+v", pr)
	}
	run(&pr, "pull", src+":v1") // same content from the registry: all cached
	if pr.Downloaded != 0 {
		t.Fatalf("pull from the registry downloaded %d bytes of blobs the node has", pr.Downloaded)
	}
	var gr gcResult
	run(&gr, "gc", "--grace", "0s", dst, src)
	if gr.Stores[0].Blobs.Deleted != 0 || gr.Stores[0].Blobs.Reachable != 8 || len(gr.Stores[1].Skipped) != 1 {
		t.Fatalf("gc = %+v", gr)
	}
	var rm map[string]any
	run(&rm, "rm", dst+":v1")
	run(&gr, "gc", "--grace", "0s", dst)
	if gr.Stores[0].Blobs.Deleted != 8 {
		t.Fatalf("gc after rm = %+v", gr)
	}
}
