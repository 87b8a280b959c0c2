package main

import (
	"context"
	"strings"
	"testing"
)

// TestRunRefusesBadFlags: a misconfigured controller stops before it
// touches the cluster, naming the flag.
func TestRunRefusesBadFlags(t *testing.T) {
	good := flags{namespace: "cryo-system", runtimeClasses: "cryo", defaultStore: "s3://snapshots/cryo"}
	for _, tc := range []struct {
		name    string
		mutate  func(*flags)
		wantErr string
	}{
		{"no namespace", func(f *flags) { f.namespace = "" }, "--namespace"},
		{"no runtime class", func(f *flags) { f.runtimeClasses = " , " }, "--runtime-classes"},
		// The class is the value of the label the cache selects by.
		{"runtime class not a label value", func(f *flags) { f.runtimeClasses = "cryo," + strings.Repeat("c", 64) }, "--runtime-classes"},
		{"store with a tag", func(f *flags) { f.defaultStore = "s3://snapshots/cryo:v1" }, "--default-store"},
		{"store not a url", func(f *flags) { f.defaultStore = "/var/lib/cryo" }, "--default-store"},
		{"e2b template without image", func(f *flags) { f.e2bAddr, f.e2bTemplates = ":3000", "base" }, "--e2b-templates"},
		{"e2b gateway without the API", func(f *flags) { f.e2bSandboxAddr = ":3001" }, "--e2b-api-bind-address"},
		{"e2b no templates", func(f *flags) { f.e2bAddr, f.e2bTemplates = ":3000", "" }, "--e2b-templates"},
		{"e2b guard never checked", func(f *flags) { f.e2bAddr, f.e2bTemplates = ":3000", "base=busybox:1" }, "--e2b-label-guard-interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := good
			tc.mutate(&f)
			if err := run(context.Background(), nil, f); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("run = %v, want an error naming %s", err, tc.wantErr)
			}
		})
	}
	if tpl, err := parseTemplates("base=busybox:1, py=python:3"); err != nil || len(tpl) != 2 || tpl["py"].Image != "python:3" || tpl["base"].Command[0] != "sleep" {
		t.Errorf("parseTemplates = %v, %v", tpl, err)
	}
	if got := splitList(" cryo, cryo-gpu ,,"); len(got) != 2 || got[0] != "cryo" || got[1] != "cryo-gpu" {
		t.Errorf("splitList = %q", got)
	}
}
