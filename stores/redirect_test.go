package stores

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry"
)

const secretSig = "deadbeef-signature-of-the-cdn"

// target serves an empty OCI index and counts the requests it gets.
func target(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, `{"schemaVersion":2,"manifests":[]}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// redirector sends every request to to + the request's path, with a
// signature in the query as a CDN or S3 presigned URL has.
func redirector(t *testing.T, to func() string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, to()+r.URL.Path+"?X-Amz-Signature="+secretSig, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// allowOnly is a redirect policy that admits URLs under prefix.
func allowOnly(prefix string) func(*url.URL) error {
	return func(u *url.URL) error {
		if strings.HasPrefix(u.String(), prefix) {
			return nil
		}
		return fmt.Errorf("%s is not allowed: %w", u, errdefs.ErrPermissionDenied)
	}
}

func TestHTTPStoreRedirects(t *testing.T) {
	ctx := context.Background()
	other, otherHits := target(t)
	for _, tc := range []struct {
		name   string
		policy func(srcURL string) func(*url.URL) error
		ok     bool
	}{
		{"no policy, other host", func(string) func(*url.URL) error { return nil }, false},
		{"policy refuses", func(string) func(*url.URL) error { return allowOnly("http://nowhere.invalid/") }, false},
		{"policy allows", func(string) func(*url.URL) error { return allowOnly(other.URL + "/ns-a/") }, true},
		{"policy allows another namespace only", func(string) func(*url.URL) error { return allowOnly(other.URL + "/ns-b/") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			otherHits.Store(0)
			src := redirector(t, func() string { return other.URL })
			s, _, err := Open(ctx, src.URL+"/ns-a/agent:v1", Options{Retries: -1, Redirect: tc.policy(src.URL)})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Tags(ctx)
			if tc.ok {
				if err != nil || otherHits.Load() == 0 {
					t.Fatalf("allowed redirect: %v, %d requests at the target", err, otherHits.Load())
				}
				return
			}
			if !errors.Is(err, errdefs.ErrPermissionDenied) {
				t.Fatalf("refused redirect: error %v, want permission denied", err)
			}
			if n := otherHits.Load(); n != 0 {
				t.Fatalf("the refused redirect target got %d requests", n)
			}
			if strings.Contains(err.Error(), secretSig) {
				t.Fatalf("error quotes the redirect's signature: %v", err)
			}
		})
	}
}

func TestRedirectWithinHost(t *testing.T) {
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/old/") {
			http.Redirect(w, r, srv.URL+"/new/"+strings.TrimPrefix(r.URL.Path, "/old/"), http.StatusMovedPermanently)
			return
		}
		fmt.Fprint(w, `{"schemaVersion":2,"manifests":[]}`)
	}))
	defer srv.Close()
	s, _, err := Open(context.Background(), srv.URL+"/old/agent:v1", Options{Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Tags(context.Background()); err != nil {
		t.Fatalf("redirect within the host without a policy: %v", err)
	}
}

func TestRedirectRefusesDowngradeAndCredentials(t *testing.T) {
	https, _ := url.Parse("https://store.example/a")
	for _, to := range []string{"http://store.example/a", "https://u:pw@store.example/a"} {
		u, _ := url.Parse(to)
		err := checkRedirect(u, https, func(*url.URL) error { return nil })
		if !errdefs.IsPermissionDenied(err) || strings.Contains(err.Error(), "pw@") {
			t.Errorf("redirect %s: %v", to, err)
		}
	}
}

// TestRegistryBlobRedirect: a registry that redirects a blob download to
// a host the policy does not allow is refused, and the error carries no
// signature.
func TestRegistryBlobRedirect(t *testing.T) {
	other, hits := target(t)
	src := redirector(t, func() string { return other.URL })
	host := strings.TrimPrefix(src.URL, "http://")
	s, err := NewRegistryStore(registry.Reference{Registry: host, Repository: "cryo/agent"},
		Options{Retries: -1, Redirect: allowOnly("https://cdn.invalid/")})
	if err != nil {
		t.Fatal(err)
	}
	d := ocispec.Descriptor{Digest: digest.Digest("sha256:" + strings.Repeat("a", 64)), Size: 100, MediaType: "application/octet-stream"}
	_, err = s.Fetch(context.Background(), d, 10, 20)
	if !errors.Is(err, errdefs.ErrPermissionDenied) || hits.Load() != 0 {
		t.Fatalf("registry redirect to a host not allowed: %v, %d requests there", err, hits.Load())
	}
	if strings.Contains(err.Error(), secretSig) {
		t.Fatalf("error quotes the signature: %v", err)
	}
}

// TestS3NeverFollowsRedirects: minio-go does not follow redirects, so an S3
// endpoint cannot send the node elsewhere.
func TestS3NeverFollowsRedirects(t *testing.T) {
	other, hits := target(t)
	src := redirector(t, func() string { return other.URL })
	f := false
	s, err := NewS3Store(S3Options{Endpoint: strings.TrimPrefix(src.URL, "http://"), UseSSL: &f, Region: "us-east-1",
		AccessKeyID: "AKIAEXAMPLE", SecretAccessKey: "s3cr3t-key-value"}, "bucket", "ns-a", "agent", Options{Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Resolve(context.Background(), "v1")
	if err == nil || hits.Load() != 0 {
		t.Fatalf("s3 behind a redirect: %v, %d requests at the target", err, hits.Load())
	}
	for _, sec := range []string{secretSig, "s3cr3t-key-value"} {
		if strings.Contains(err.Error(), sec) {
			t.Fatalf("s3 error quotes %q: %v", sec, err)
		}
	}
}
