package annotations

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cryo-runtime/cryo/agent/envd"
	"github.com/cryo-runtime/cryo/configs"
)

func TestParse(t *testing.T) {
	cfg := configs.Default()
	for _, tc := range []struct {
		name    string
		in      map[string]string
		want    func(Request) bool
		wantErr string
	}{
		{name: "defaults", in: map[string]string{"other/x": "y"},
			want: func(r Request) bool { return r.VCPUs == 1 && r.MemoryMiB == 512 && r.RestoreFallback == "fail" }},
		{name: "sizing", in: map[string]string{VCPUs: "2", Memory: "1Gi"},
			want: func(r Request) bool { return r.VCPUs == 2 && r.MemoryMiB == 1024 }},
		{name: "memory plain", in: map[string]string{Memory: "768"}, want: func(r Request) bool { return r.MemoryMiB == 768 }},
		{name: "vcpus too many", in: map[string]string{VCPUs: "64"}, wantErr: "between 1 and 8"},
		{name: "memory too small", in: map[string]string{Memory: "16Mi"}, wantErr: "between 128"},
		{name: "unknown key", in: map[string]string{"cryo.dev/kernel": "/tmp/evil"}, wantErr: "unknown cryo annotation"},
		{name: "restore by checkpoint name passes through", in: map[string]string{RestoreCheckpoint: "ckpt-1", RestoreFrom: "s3://b/ns:cp-1"},
			want: func(r Request) bool { return r.RestoreFrom == "s3://b/ns:cp-1" }},
		{name: "fallback", in: map[string]string{RestoreFallback: "retry"}, wantErr: "fail or cold"},
		{name: "restore mode default", in: map[string]string{}, want: func(r Request) bool { return r.RestoreMode == "lazy" }},
		{name: "restore mode eager", in: map[string]string{RestoreMode: "eager"}, want: func(r Request) bool { return r.RestoreMode == "eager" }},
		{name: "restore mode lazy", in: map[string]string{RestoreMode: "lazy"}, want: func(r Request) bool { return r.RestoreMode == "lazy" }},
		{name: "restore mode bad", in: map[string]string{RestoreMode: "postcopy"}, wantErr: "eager or lazy"},
		{name: "digest", in: map[string]string{RestoreDigest: "md5:x"}, wantErr: "sha256"},
		{name: "kruise alias", in: map[string]string{KruiseArchiveLocation: "s3://b/x:1"},
			want: func(r Request) bool { return r.RestoreFrom == "s3://b/x:1" }},
		{name: "kata alias", in: map[string]string{KataRestoreFrom: "demo:v1", CRISandboxNamespace: "team-a"},
			want: func(r Request) bool { return r.RestoreFrom == "file:///var/lib/cryo/store/team-a/demo:v1" }},
		{name: "kata alias without namespace", in: map[string]string{KataRestoreFrom: "demo:v1"}, wantErr: "per namespace"},
		{name: "kata alias bad namespace", in: map[string]string{KataRestoreFrom: "demo:v1", CRISandboxNamespace: "../x"}, wantErr: "per namespace"},
		{name: "namespace", in: map[string]string{CRISandboxNamespace: "team-a"}, want: func(r Request) bool { return r.Namespace == "team-a" }},
		{name: "envd token hash", in: map[string]string{EnvdAccessTokenSHA256: strings.Repeat("0f", 32)},
			want: func(r Request) bool { return true }},
		{name: "envd token hash upper case", in: map[string]string{EnvdAccessTokenSHA256: strings.Repeat("0F", 32)}, wantErr: EnvdAccessTokenSHA256 + `="` + strings.Repeat("0F", 32) + `": want 64 lowercase hex`},
		{name: "envd token hash short", in: map[string]string{EnvdAccessTokenSHA256: "abc"}, wantErr: EnvdAccessTokenSHA256},
		{name: "envd token plain", in: map[string]string{EnvdAccessTokenSHA256: strings.Repeat("x", 64)}, wantErr: "64 lowercase hex"},
		{name: "kata alias escapes", in: map[string]string{KataRestoreFrom: "../../etc/passwd"}, wantErr: "plain snapshot name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse(tc.in, cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("error = %v, want %q (invalid argument)", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.want(r) {
				t.Fatalf("Parse = %+v, %v", r, err)
			}
		})
	}
	eager := configs.Default()
	eager.Restore.Mode = configs.RestoreEager
	if r, err := Parse(nil, eager); err != nil || r.RestoreMode != "eager" {
		t.Fatalf("an eager node's default: %+v, %v", r, err)
	}
	if _, err := Parse(map[string]string{RestoreMode: "lazy"}, eager); err == nil || !strings.Contains(err.Error(), `cryo.dev/restore-mode="lazy": this node does not allow lazy`) || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("lazy on an eager node: %v, want refused", err)
	}
	eager.Restore.AllowedModes = []string{configs.RestoreLazy}
	if r, err := Parse(map[string]string{RestoreMode: "lazy"}, eager); err != nil || r.RestoreMode != "lazy" {
		t.Fatalf("lazy where the eager node allows it: %+v, %v", r, err)
	}
	cfg.Annotations.Enabled = []string{VCPUs}
	if _, err := Parse(map[string]string{Memory: "1Gi"}, cfg); err == nil || !strings.Contains(err.Error(), "not enabled") {
		t.Fatalf("disabled annotation accepted: %v", err)
	}
}

// TestAliasesHonourEnabled: the Kruise and Kata aliases stand for
// cryo.dev/restore-from and are refused where it is not enabled.
func TestAliasesHonourEnabled(t *testing.T) {
	cfg := configs.Default()
	cfg.Snapshot.LocalRoot = "/var/lib/cryo/store"
	for _, enabled := range [][]string{{VCPUs, Memory}, {}, {"cryo.dev/v*"}} {
		cfg.Annotations.Enabled = enabled
		for _, a := range []map[string]string{
			{KruiseArchiveLocation: "s3://b/x:1"},
			{KataRestoreFrom: "demo:v1"},
		} {
			r, err := Parse(a, cfg)
			if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), RestoreFrom) {
				t.Errorf("enabled %v, %v: Parse = %+v, %v; want a refusal naming %s", enabled, a, r, err, RestoreFrom)
			}
		}
	}
	cfg.Annotations.Enabled = []string{RestoreFrom}
	if r, err := Parse(map[string]string{KruiseArchiveLocation: "s3://b/x:1"}, cfg); err != nil || r.RestoreFrom != "s3://b/x:1" {
		t.Fatalf("alias with %s enabled: %+v, %v", RestoreFrom, r, err)
	}
}

// TestEnvdKey: the node and the guest name the same annotation.
func TestEnvdKey(t *testing.T) {
	if EnvdAccessTokenSHA256 != envd.Annotation {
		t.Fatalf("annotations has %s, the guest's envd reads %s", EnvdAccessTokenSHA256, envd.Annotation)
	}
}

func TestTenant(t *testing.T) {
	if got := Tenant(map[string]string{CRISandboxNamespace: "team-a"}, "k8s.io"); got != "team-a" {
		t.Errorf("CRI pod: tenant %q", got)
	}
	if got := Tenant(map[string]string{}, "default"); got != "default" {
		t.Errorf("ctr task: tenant %q", got)
	}
}
