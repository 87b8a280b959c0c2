package stores

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

// Options configure Open. The zero value is usable: S3 settings come from the
// environment, downloads get the defaults below.
type Options struct {
	// S3 configures s3:// URLs; empty fields are taken from STORAGE_S3_*.
	S3 S3Options
	// MinIO configures minio:// URLs; empty fields are taken from STORAGE_MINIO_*.
	MinIO S3Options
	// Registry configures oci:// URLs.
	Registry RegistryOptions
	// HTTPClient is used by the http(s) and oci stores; nil means a client
	// with connect and header timeouts.
	HTTPClient *http.Client

	// MaxConcurrent bounds the requests that download at once through one
	// store (default 8).
	MaxConcurrent int
	// Retries is how many times a transient failure is retried (default 5).
	Retries int
	// RetryBackoff is the first retry delay, doubled each retry up to
	// MaxBackoff (defaults 250ms and 10s).
	RetryBackoff, MaxBackoff time.Duration
	// StallTimeout cuts a request that received no byte for this long and
	// retries it (default 30s).
	StallTimeout time.Duration

	// Getenv reads the environment (default os.Getenv); tests replace it.
	Getenv func(string) string

	// Redirect decides, hop by hop, whether the http(s) and oci stores
	// follow a redirect to u (its query already cut off); an error refuses
	// it. nil follows redirects only within the host of the request. S3
	// clients never follow redirects. A redirect from https to http is
	// always refused.
	Redirect func(u *url.URL) error
}

// S3Options are the connection settings of an S3 or MinIO store.
type S3Options struct {
	Endpoint        string // host:port, or http(s)://host:port which also sets UseSSL
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	Bucket          string // used when the URL has no bucket (s3:///prefix/name:tag)
	Region          string
	Prefix          string // prepended to the URL's prefix
	UseSSL          *bool  // default true
}

// RegistryOptions are the settings of an oci:// store.
type RegistryOptions struct {
	// PlainHTTP talks http instead of https to every registry. It is
	// implied for localhost and 127.0.0.1.
	PlainHTTP bool
	// PlainHTTPHosts lists registries (host or host:port) reached over http.
	PlainHTTPHosts []string
	Username       string
	Password       string
}

func (o Options) withDefaults() Options {
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 8
	}
	if o.Retries < 0 {
		o.Retries = 0
	} else if o.Retries == 0 {
		o.Retries = 5
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 250 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 10 * time.Second
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 30 * time.Second
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.HTTPClient == nil {
		o.HTTPClient = defaultHTTPClient()
	}
	o.HTTPClient = withRedirectPolicy(o.HTTPClient, o.Redirect)
	return o
}

func defaultHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = time.Minute
	t.MaxIdleConnsPerHost = 32
	return &http.Client{Transport: t}
}

// Open parses a store URL and returns the store and the reference inside it
// (a tag, a digest "sha256:...", or "" when the URL names none):
//
//	file:///root/path/name:tag     OCI image layout in /root/path/name
//	s3://bucket/prefix/name:tag    S3 (minio:// the same with STORAGE_MINIO_*)
//	oci://registry[:port]/repo:tag OCI registry
//	https://host/path/name:tag     OCI image layout served over HTTP, read-only
//
// Any form takes "@sha256:<hex>" instead of ":tag". The store is wrapped
// with retries, a stall timeout and a concurrency bound (see Options).
func Open(ctx context.Context, rawURL string, opts Options) (Store, string, error) {
	opts = opts.withDefaults()
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("parse store url: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, "", fmt.Errorf("store url %q: query, fragment and user info are not allowed: %w", u.Redacted(), errdefs.ErrInvalidArgument)
	}
	base, ref, err := SplitRef(u.Path)
	if err != nil {
		return nil, "", fmt.Errorf("store url %q: %w", u.Redacted(), err)
	}
	var s Store
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, "", fmt.Errorf("file url %q: host %q not supported: %w", rawURL, u.Host, errdefs.ErrInvalidArgument)
		}
		s, err = NewFileStore(base)
	case "s3", "minio":
		s, err = newS3FromURL(ctx, u.Scheme, u.Host, base, opts)
	case "oci":
		s, err = newRegistryStore(u.Host, strings.TrimPrefix(base, "/"), opts)
	case "http", "https":
		s, err = newHTTPStore(u.Scheme+"://"+u.Host+base, opts)
	default:
		return nil, "", fmt.Errorf("store url %q: unknown scheme %q: %w", u.Redacted(), u.Scheme, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, "", err
	}
	return newReliableStore(s, opts), ref, nil
}

// SplitRef splits "/a/b/name:tag" into ("/a/b/name", "tag") and
// "/a/b/name@sha256:..." into ("/a/b/name", "sha256:..."). Only the last path
// element is looked at, so "host:port" in front stays intact.
func SplitRef(p string) (base, ref string, err error) {
	dir, last := path.Split(p)
	if i := strings.IndexByte(last, '@'); i >= 0 {
		d, err := digest.Parse(last[i+1:])
		if err != nil {
			return "", "", fmt.Errorf("reference %q: %w: %w", last[i+1:], err, errdefs.ErrInvalidArgument)
		}
		return dir + last[:i], d.String(), nil
	}
	if i := strings.LastIndexByte(last, ':'); i >= 0 {
		tag := last[i+1:]
		if err := validTag(tag); err != nil {
			return "", "", err
		}
		return dir + last[:i], tag, nil
	}
	return p, "", nil
}

// validTag accepts OCI distribution tags: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}.
func validTag(tag string) error {
	ok := len(tag) > 0 && len(tag) <= 128 && tag[0] != '.' && tag[0] != '-'
	for i := 0; ok && i < len(tag); i++ {
		c := tag[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
	}
	if !ok {
		return fmt.Errorf("invalid tag %q: %w", tag, errdefs.ErrInvalidArgument)
	}
	return nil
}

// isDigestRef reports whether ref is a digest rather than a tag.
func isDigestRef(ref string) (digest.Digest, bool) {
	d, err := digest.Parse(ref)
	return d, err == nil
}

func envBool(v string) (*bool, error) {
	if v == "" {
		return nil, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return nil, fmt.Errorf("parse bool %q: %w", v, errdefs.ErrInvalidArgument)
	}
	return &b, nil
}
