package controller

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cryov1 "github.com/cryo-runtime/cryo/api/v1alpha1"
)

func TestValidateSpec(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spec    cryov1.CheckpointSpec
		wantErr string
	}{
		{name: "minimal", spec: cryov1.CheckpointSpec{PodName: "p"}},
		{name: "everything", spec: cryov1.CheckpointSpec{PodName: "p", ContainerName: "c", TTLAfterFinished: "7d",
			Store: "s3://snapshots/cryo/ns", PersistentContents: []cryov1.PersistentContent{"memory", "filesystem"}}},
		{name: "no pod", spec: cryov1.CheckpointSpec{}, wantErr: "spec.podName"},
		{name: "other contents", spec: cryov1.CheckpointSpec{PodName: "p", PersistentContents: []cryov1.PersistentContent{"memory", "gpu"}},
			wantErr: `spec.persistentContents[1] "gpu"`},
		{name: "bad ttl", spec: cryov1.CheckpointSpec{PodName: "p", TTLAfterFinished: "1w"}, wantErr: "spec.ttlAfterFinished"},
		{name: "zero ttl", spec: cryov1.CheckpointSpec{PodName: "p", TTLAfterFinished: "0s"}, wantErr: "positive"},
		{name: "store with tag", spec: cryov1.CheckpointSpec{PodName: "p", Store: "s3://b/ns:pod-p"}, wantErr: "without a tag"},
		{name: "store not a url", spec: cryov1.CheckpointSpec{PodName: "p", Store: "/var/lib/x"}, wantErr: "not a store URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateSpec(tc.spec)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("ValidateSpec = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseTTL(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30s": 30 * time.Second, "5m": 5 * time.Minute, "2h": 2 * time.Hour, "1h30m": 90 * time.Minute, "3d": 72 * time.Hour,
		"3650d": 3650 * 24 * time.Hour, "87600h": 3650 * 24 * time.Hour, ".5h": 30 * time.Minute, "+2d": 48 * time.Hour,
	} {
		if got, err := ParseTTL(in); err != nil || got != want {
			t.Errorf("ParseTTL(%q) = %v, %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "-1d", "1.5d", "4000d", "-5m", "soon", "1d12h", "0d", "0s", "3651d", "87601h"} {
		if got, err := ParseTTL(in); err == nil {
			t.Errorf("ParseTTL(%q) = %v, want an error", in, got)
		}
	}
}

func TestTargets(t *testing.T) {
	for in, want := range map[string][2]string{
		"s3://snapshots/cryo/team-a/pods:pod-web":      {"s3://snapshots/cryo/team-a/pods", "pod-web"},
		"oci://registry:5000/cryo/team-a/pods:pod-web": {"oci://registry:5000/cryo/team-a/pods", "pod-web"},
		"oci://registry:5000/cryo/team-a":              {"oci://registry:5000/cryo/team-a", ""},
		"file:///var/lib/cryo/team-a/pods:pod-x":       {"file:///var/lib/cryo/team-a/pods", "pod-x"},
	} {
		repo, tag, err := splitTarget(in)
		if err != nil || repo != want[0] || tag != want[1] {
			t.Errorf("splitTarget(%q) = %q, %q, %v, want %q", in, repo, tag, err, want)
		}
	}
	for base, ok := range map[string]bool{"s3://snapshots/cryo": true, "oci://registry:5000": true, "oci://registry:5000/cryo": true,
		"file:///var/lib/cryo": true, "s3://snapshots/cryo:v1": false, "snapshots/cryo": false} {
		if err := CheckStoreBase(base); (err == nil) != ok {
			t.Errorf("CheckStoreBase(%q) = %v", base, err)
		}
	}
	if got := DefaultTarget("s3://snapshots/cryo/", "team-a", "web-0"); got != "s3://snapshots/cryo/team-a/pods:pod-web-0" {
		t.Errorf("DefaultTarget = %q", got)
	}
	long := strings.Repeat("a", 200)
	tag := podTag(long)
	if len(tag) != maxTag || !strings.HasPrefix(tag, "pod-aaa") || tag == podTag(long+"b") {
		t.Errorf("podTag of a 200-character name = %q (%d): want 128 characters, distinct per name", tag, len(tag))
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{AnnotationCheckpointTo: "s3://b/ns"}}}
	if _, _, _, err := podTarget(pod); err == nil || !strings.Contains(err.Error(), "names no tag") {
		t.Errorf("podTarget of a target without a tag: %v", err)
	}
}

func TestInNamespaceStore(t *testing.T) {
	for _, tc := range []struct {
		base, ns, repo string
		want           bool
	}{
		{"s3://b/cryo", "team-a", "s3://b/cryo/team-a/pods", true},
		{"s3://b/cryo/", "team-a", "s3://b/cryo/team-a", true},
		{"s3://b/cryo", "team-a", "s3://b/cryo/team-ab/pods", false},
		{"s3://b/cryo", "team-a", "s3://b/cryo/team-b/pods", false},
		{"s3://b/cryo", "team-a", "s3://b/cryo/team-a/../team-b/pods", false},
		{"s3://b/cryo", "team-a", "s3://b/cryo/team-a/%2e%2e/team-b/pods", false},
		{"s3://b/cryo", "team-a", "s3://user@b/cryo/team-a/pods", false},
		{"s3://b/cryo", "team-a", "https://metadata.internal/team-a/pods", false},
		{"", "team-a", "s3://b/cryo/team-a/pods", false},
	} {
		if got := inNamespaceStore(tc.base, tc.ns, tc.repo); got != tc.want {
			t.Errorf("inNamespaceStore(%q, %q, %q) = %v, want %v", tc.base, tc.ns, tc.repo, got, tc.want)
		}
	}
}
