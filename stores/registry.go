package stores

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/cryo-runtime/cryo/internal/redact"
)

// registryStore is one repository of an OCI distribution registry, through
// oras-go. Blob ranges use a Range request when the registry honours it and
// skip bytes otherwise.
type registryStore struct {
	repo   *remote.Repository
	client *auth.Client
	ref    registry.Reference // Registry and Repository set, Reference empty
}

var _ Store = (*registryStore)(nil)

func newRegistryStore(host, repo string, opts Options) (Store, error) {
	ref := registry.Reference{Registry: host, Repository: repo}
	if err := ref.Validate(); err != nil {
		return nil, fmt.Errorf("oci store %s/%s: %w: %w", host, repo, err, errdefs.ErrInvalidArgument)
	}
	return NewRegistryStore(ref, opts)
}

// NewRegistryStore returns the store for one registry repository.
func NewRegistryStore(ref registry.Reference, opts Options) (Store, error) {
	opts = opts.withDefaults()
	r, err := remote.NewRepository(ref.Registry + "/" + ref.Repository)
	if err != nil {
		return nil, fmt.Errorf("oci store %s/%s: %w", ref.Registry, ref.Repository, err)
	}
	host := ref.Host()
	r.PlainHTTP = opts.Registry.PlainHTTP || isLoopbackHost(host) ||
		slices.Contains(opts.Registry.PlainHTTPHosts, host) || slices.Contains(opts.Registry.PlainHTTPHosts, ref.Registry)
	hc := *opts.HTTPClient
	if hc.Transport == nil {
		hc.Transport = http.DefaultTransport
	}
	client := &auth.Client{Client: &hc, Cache: auth.NewCache()}
	if opts.Registry.Username != "" || opts.Registry.Password != "" {
		client.Credential = auth.StaticCredential(host, auth.Credential{
			Username: opts.Registry.Username, Password: opts.Registry.Password,
		})
	}
	client.SetUserAgent("cryo")
	r.Client = client
	// cryo finds signatures by tag (snapshot.SignatureTag), not through the
	// referrers API: claiming the capability keeps oras from maintaining a
	// "sha256-<subject>" referrers index tag for every signature it pushes.
	_ = r.SetReferrersCapability(true)
	return &registryStore{repo: r, client: client, ref: ref}, nil
}

func isLoopbackHost(host string) bool {
	h := host
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.HasSuffix(h, "]") {
		h = h[:i]
	}
	return h == "localhost" || h == "127.0.0.1" || h == "[::1]" || strings.HasPrefix(h, "127.")
}

// regErr maps oras errors to errdefs.
func regErr(op string, err error) error {
	if err == nil {
		return nil
	}
	// oras quotes the request URL, which after a redirect to a blob
	// store carries its signature.
	err = redact.Error(err)
	if errors.Is(err, errdef.ErrNotFound) {
		return fmt.Errorf("%s: %w: %w", op, err, errdefs.ErrNotFound)
	}
	if errors.Is(err, errdef.ErrUnsupported) {
		return fmt.Errorf("%s: %w: %w", op, err, errdefs.ErrNotImplemented)
	}
	if code := statusOf(err); code != 0 {
		return fmt.Errorf("%s: %w: %w", op, err, statusSentinel(code))
	}
	return fmt.Errorf("%s: %w", op, err)
}

func (s *registryStore) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	ok, err := s.repo.Exists(ctx, desc)
	return ok, regErr("exists "+desc.Digest.String(), err)
}

func (s *registryStore) isManifest(desc ocispec.Descriptor) bool {
	return slices.Contains(s.repo.ManifestMediaTypes, desc.MediaType) || slices.Contains([]string{
		ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex,
		"application/vnd.docker.distribution.manifest.v2+json",
		"application/vnd.docker.distribution.manifest.list.v2+json",
	}, desc.MediaType)
}

func (s *registryStore) Fetch(ctx context.Context, desc ocispec.Descriptor, offset, length int64) (io.ReadCloser, error) {
	op := "fetch " + desc.Digest.String()
	if length == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	if (offset == 0 && length < 0) || s.isManifest(desc) {
		rc, err := s.repo.Fetch(ctx, desc)
		if err != nil {
			return nil, regErr(op, err)
		}
		return skipTo(rc, offset, op)
	}
	ref := s.ref
	ref.Reference = desc.Digest.String()
	ctx = auth.AppendRepositoryScope(ctx, ref, auth.ActionPull)
	scheme := "https"
	if s.repo.PlainHTTP {
		scheme = "http"
	}
	u := fmt.Sprintf("%s://%s/v2/%s/blobs/%s", scheme, ref.Host(), ref.Repository, desc.Digest)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	setRange(req, offset, length)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, redact.Error(err))
	}
	return rangedBody(resp, offset, length, op)
}

// setRange asks for bytes [offset, offset+length) (to the end when length < 0).
func setRange(req *http.Request, offset, length int64) {
	switch {
	case length > 0:
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", offset, offset+length-1))
	case offset > 0:
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
}

// rangedBody accepts a 206 as is and a 200 (range ignored) by skipping to
// offset; the caller limits the length.
func rangedBody(resp *http.Response, offset, length int64, op string) (io.ReadCloser, error) {
	if err := checkStatus(resp); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	rc := resp.Body
	if resp.StatusCode != http.StatusPartialContent {
		var err error
		if rc, err = skipTo(rc, offset, op); err != nil {
			return nil, err
		}
	}
	if length >= 0 {
		return limitReadCloser(rc, length), nil
	}
	return rc, nil
}

func limitReadCloser(rc io.ReadCloser, n int64) io.ReadCloser {
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(rc, n), rc}
}

// skipTo discards offset bytes of rc.
func skipTo(rc io.ReadCloser, offset int64, op string) (io.ReadCloser, error) {
	if offset <= 0 {
		return rc, nil
	}
	if n, err := io.CopyN(io.Discard, rc, offset); err != nil {
		rc.Close()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: blob ends at %d before offset %d: %w", op, n, offset, errdefs.ErrOutOfRange)
		}
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return rc, nil
}

func (s *registryStore) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	if ok, err := s.Exists(ctx, desc); err != nil || ok {
		return err
	}
	err := s.repo.Push(ctx, desc, ctxReader{ctx, r})
	if errors.Is(err, errdef.ErrAlreadyExists) {
		return nil
	}
	return regErr("push "+desc.Digest.String(), err)
}

func (s *registryStore) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	d, err := s.repo.Resolve(ctx, ref)
	if err != nil {
		return ocispec.Descriptor{}, regErr("resolve "+s.ref.Registry+"/"+s.ref.Repository+":"+ref, err)
	}
	d.Annotations = nil
	return d, nil
}

func (s *registryStore) Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error {
	if err := validTag(ref); err != nil {
		return err
	}
	return regErr("tag "+ref, s.repo.Tag(ctx, desc, ref))
}

func (s *registryStore) Tags(ctx context.Context) ([]string, error) {
	var tags []string
	err := s.repo.Tags(ctx, "", func(t []string) error {
		tags = append(tags, t...)
		return nil
	})
	if err != nil {
		if err = regErr("list tags of "+s.ref.Repository, err); errdefs.IsNotFound(err) {
			return []string{}, nil // a repository nothing was pushed to yet
		}
		return nil, err
	}
	slices.Sort(tags)
	return tags, nil
}

// Untag deletes the manifest the tag names (the distribution API has no
// tag-only delete): other tags of the same manifest go with it. The
// registry must allow deletes (storage.delete.enabled).
func (s *registryStore) Untag(ctx context.Context, ref string) error {
	d, err := s.Resolve(ctx, ref)
	if err != nil {
		return err
	}
	return regErr("delete manifest "+d.Digest.String(), s.repo.Manifests().Delete(ctx, d))
}
