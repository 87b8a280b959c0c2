package stores

import (
	"context"
	"testing"

	"github.com/containerd/errdefs"
)

func TestSplitRef(t *testing.T) {
	d := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		in, base, ref string
		bad           bool
	}{
		{in: "/var/lib/snaps/app:v1", base: "/var/lib/snaps/app", ref: "v1"},
		{in: "/var/lib/snaps/app", base: "/var/lib/snaps/app"},
		{in: "/a:b/app:v1", base: "/a:b/app", ref: "v1"},
		{in: "/snaps/app@" + d, base: "/snaps/app", ref: d},
		{in: "/snaps/app@sha256:nothex", bad: true},
		{in: "/snaps/app:bad/tag", base: "/snaps/app:bad/tag"}, // a ':' before the last element is a path
		{in: "/snaps/app:-x", bad: true},
		{in: "/snaps/app:", bad: true},
	} {
		base, ref, err := SplitRef(tc.in)
		if tc.bad {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("SplitRef(%q) err = %v, want invalid argument", tc.in, err)
			}
			continue
		}
		if err != nil || base != tc.base || ref != tc.ref {
			t.Errorf("SplitRef(%q) = %q, %q, %v; want %q, %q", tc.in, base, ref, err, tc.base, tc.ref)
		}
	}
}

func TestOpenSchemes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	env := map[string]string{
		"STORAGE_S3_ENDPOINT": "http://127.0.0.1:9", "STORAGE_S3_ACCESS_KEY_ID": "k",
		"STORAGE_S3_SECRET_ACCESS_KEY": "s", "STORAGE_S3_PREFIX": "envprefix",
		"STORAGE_MINIO_ENDPOINT": "127.0.0.1:9", "STORAGE_MINIO_USE_SSL": "false",
		"STORAGE_MINIO_BUCKET_NAME": "envbucket",
	}
	opts := Options{Getenv: func(k string) string { return env[k] }}
	for _, tc := range []struct {
		url, ref string
		check    func(Store) bool
	}{
		{"file://" + dir + "/app:v1", "v1", func(s Store) bool { f, ok := s.(*fileStore); return ok && f.root == dir+"/app" }},
		{"s3://bucket/team/app:v2", "v2", func(s Store) bool {
			x, ok := s.(*s3Store)
			return ok && x.bucket == "bucket" && x.prefix == "envprefix/team" && x.name == "app" && x.c.EndpointURL().Scheme == "http"
		}},
		{"minio:///app:v3", "v3", func(s Store) bool { x, ok := s.(*s3Store); return ok && x.bucket == "envbucket" && x.prefix == "" }},
		{"oci://127.0.0.1:5000/cryo/app:v4", "v4", func(s Store) bool {
			x, ok := s.(*registryStore)
			return ok && x.repo.PlainHTTP && x.ref.Repository == "cryo/app" && x.ref.Registry == "127.0.0.1:5000"
		}},
		{"oci://registry.example.com/app:v5", "v5", func(s Store) bool { x, ok := s.(*registryStore); return ok && !x.repo.PlainHTTP }},
		{"https://example.com/layouts/app:v6", "v6", func(s Store) bool {
			x, ok := s.(*httpStore)
			return ok && x.base == "https://example.com/layouts/app"
		}},
	} {
		s, ref, err := Open(ctx, tc.url, opts)
		if err != nil {
			t.Errorf("Open(%s): %v", tc.url, err)
			continue
		}
		if ref != tc.ref || !tc.check(s.(*reliableStore).Unwrap()) {
			t.Errorf("Open(%s) = %#v, ref %q", tc.url, s.(*reliableStore).Unwrap(), ref)
		}
	}
	for _, bad := range []string{
		"ftp://x/y:z", "file:///rel/../x:y?q=1", "file://otherhost/x:y", "s3:///app:v1", "s3://bucket/:v1",
		"oci://host/UPPER:v1", "file:///x/app:bad!tag", "minio://b/app:v1?x",
	} {
		o := Options{Getenv: func(string) string { return "" }}
		if _, _, err := Open(ctx, bad, o); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Open(%s) err = %v, want invalid argument", bad, err)
		}
	}
}
