//go:build integration

package integration

import (
	"testing"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/stores/storetest"
)

// s3Node points the node's S3 stores at s3 and allows its bucket.
func s3Node(s3 *storetest.S3Server) harness.Option {
	return func(c *configs.Config) {
		c.Stores.S3 = configs.S3{Endpoint: s3.Endpoint, AccessKey: s3.AccessKey, SecretKey: s3.SecretKey, Region: "us-east-1"}
		c.Stores.Allowed = append(c.Stores.Allowed, "s3://"+s3.Bucket+"/")
	}
}

// TestRestoreFromS3AndRegistry: checkpoint to, and restore from, a real
// S3-compatible server (versitygw) and a real OCI registry (distribution),
// both on loopback.
func TestRestoreFromS3AndRegistry(t *testing.T) {
	s3 := storetest.StartS3(t)
	reg := storetest.StartRegistry(t)
	e := harness.Start(t, s3Node(s3), func(c *configs.Config) {
		c.Stores.Allowed = append(c.Stores.Allowed, "oci://"+reg+"/cryo/")
		lazyNode(c)
	})
	before := startWorkload(t, e, "src")
	for _, tc := range []struct{ name, url string }{
		{"s3", "s3://" + s3.Bucket + "/agents/demo:v1"},
		{"oci", "oci://" + reg + "/cryo/demo:v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkpoint(t, e, "src", tc.url)
			id := "from-" + tc.name
			// Lazily first: RAM and disks served chunk by chunk from the
			// store, then eagerly (from the node cache).
			restore(t, e, id+"-lazy", tc.url, lazyMode)
			if st := readState(t, e, id+"-lazy"); st.bootID != before.bootID || st.secret != before.secret || st.file != "on-rootfs" {
				t.Fatalf("lazily restored from %s: %+v, checkpointed %+v", tc.url, st, before)
			}
			restore(t, e, id, tc.url)
			st := readState(t, e, id)
			if st.bootID != before.bootID || st.secret != before.secret || st.counter < before.counter || st.file != "on-rootfs" {
				t.Fatalf("restored from %s: %+v, checkpointed %+v", tc.url, st, before)
			}
		})
	}
}
