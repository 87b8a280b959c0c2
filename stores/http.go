package stores

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/internal/redact"
)

// httpStore reads an OCI image layout served over http(s) (index.json,
// blobs/sha256/<hex>), e.g. a file store behind any web server. It is
// read-only: Push, Tag and Untag return errdefs.ErrNotImplemented.
type httpStore struct {
	base   string // no trailing slash
	client *http.Client
}

var _ Store = (*httpStore)(nil)

func newHTTPStore(base string, opts Options) (Store, error) {
	return NewHTTPStore(base, opts)
}

// NewHTTPStore returns the read-only store for the OCI layout at base URL.
func NewHTTPStore(base string, opts Options) (Store, error) {
	opts = opts.withDefaults()
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return nil, fmt.Errorf("http store %q: not an http(s) url: %w", base, errdefs.ErrInvalidArgument)
	}
	return &httpStore{base: strings.TrimRight(base, "/"), client: opts.HTTPClient}, nil
}

// maxRedirects bounds a redirect chain, as net/http's default does.
const maxRedirects = 10

// withRedirectPolicy returns a copy of c that follows a redirect only when
// policy allows its target: a store reached through an allowed URL must not
// become a way for the node to fetch from, or send credentials to, a host
// the node never allowed.
func withRedirectPolicy(c *http.Client, policy func(*url.URL) error) *http.Client {
	cc := *c
	cc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects: %w", maxRedirects, errdefs.ErrPermissionDenied)
		}
		return checkRedirect(req.URL, via[0].URL, policy)
	}
	return &cc
}

func checkRedirect(to, first *url.URL, policy func(*url.URL) error) error {
	target := *to
	target.RawQuery, target.ForceQuery, target.Fragment, target.RawFragment = "", false, "", ""
	shown := redact.URL(to.String())
	switch {
	case to.User != nil:
		return fmt.Errorf("redirect to %s: credentials in a redirect target: %w", shown, errdefs.ErrPermissionDenied)
	case first.Scheme == "https" && to.Scheme != "https":
		return fmt.Errorf("redirect to %s: from https to %s: %w", shown, to.Scheme, errdefs.ErrPermissionDenied)
	case policy == nil && (to.Scheme != first.Scheme || to.Host != first.Host):
		return fmt.Errorf("redirect to %s: another host than %s: %w", shown, first.Host, errdefs.ErrPermissionDenied)
	case policy == nil:
		return nil
	}
	if err := policy(&target); err != nil {
		return fmt.Errorf("redirect to %s: %w", shown, err)
	}
	return nil
}

func (h *httpStore) get(ctx context.Context, method, p string, offset, length int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, h.base+"/"+p, nil)
	if err != nil {
		return nil, err
	}
	setRange(req, offset, length)
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, redact.Error(err)
	}
	if err := checkStatus(resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func blobRelPath(desc ocispec.Descriptor) (string, error) {
	if err := desc.Digest.Validate(); err != nil {
		return "", fmt.Errorf("digest %q: %w: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
	}
	return "blobs/" + desc.Digest.Algorithm().String() + "/" + desc.Digest.Encoded(), nil
}

func (h *httpStore) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	p, err := blobRelPath(desc)
	if err != nil {
		return false, err
	}
	resp, err := h.get(ctx, http.MethodHead, p, 0, -1)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("exists %s: %w", desc.Digest, err)
	}
	resp.Body.Close()
	return desc.Size <= 0 || resp.ContentLength < 0 || resp.ContentLength == desc.Size, nil
}

func (h *httpStore) Fetch(ctx context.Context, desc ocispec.Descriptor, offset, length int64) (io.ReadCloser, error) {
	p, err := blobRelPath(desc)
	if err != nil {
		return nil, err
	}
	op := "fetch " + desc.Digest.String()
	if length == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	resp, err := h.get(ctx, http.MethodGet, p, offset, length)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return rangedBody(resp, offset, length, op)
}

func (h *httpStore) readIndex(ctx context.Context) (*ocispec.Index, error) {
	resp, err := h.get(ctx, http.MethodGet, ocispec.ImageIndexFile, 0, -1)
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	defer resp.Body.Close()
	b, err := readLimited(resp.Body, maxManifestSize)
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("parse index at %s: %w: %w", h.base, err, errdefs.ErrDataLoss)
	}
	return &idx, nil
}

func (h *httpStore) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	if d, ok := isDigestRef(ref); ok {
		rc, err := h.Fetch(ctx, ocispec.Descriptor{Digest: d}, 0, -1)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		defer rc.Close()
		b, err := readLimited(rc, maxManifestSize)
		if err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("resolve %s: %w", d, err)
		}
		return manifestDescriptor(d, b), nil
	}
	idx, err := h.readIndex(ctx)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	for _, m := range idx.Manifests {
		if m.Annotations[ocispec.AnnotationRefName] == ref {
			m.Annotations = nil
			return m, nil
		}
	}
	return ocispec.Descriptor{}, fmt.Errorf("reference %q at %s: %w", ref, h.base, errdefs.ErrNotFound)
}

func (h *httpStore) Tags(ctx context.Context) ([]string, error) {
	idx, err := h.readIndex(ctx)
	if err != nil {
		return nil, err
	}
	return indexTags(idx), nil
}

func (h *httpStore) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	return fmt.Errorf("push to %s: http stores are read-only: %w", h.base, errdefs.ErrNotImplemented)
}

func (h *httpStore) Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error {
	return fmt.Errorf("tag %s at %s: http stores are read-only: %w", ref, h.base, errdefs.ErrNotImplemented)
}

func (h *httpStore) Untag(ctx context.Context, ref string) error {
	return fmt.Errorf("untag %s at %s: http stores are read-only: %w", ref, h.base, errdefs.ErrNotImplemented)
}
