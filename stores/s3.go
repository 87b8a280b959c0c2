package stores

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/internal/redact"
)

// s3Store keeps a snapshot repository in a bucket:
//
//	<prefix>/blobs/sha256/<hex>     blobs and manifests, shared by every name
//	<prefix>/refs/<name>/<tag>      a JSON OCI descriptor of the tagged manifest
//
// Blobs are shared across names under one prefix, so snapshots of different
// sandboxes from one template deduplicate. An object PUT is atomic in S3, and
// the reference object is written after every blob it reaches.
type s3Store struct {
	c      *minio.Client
	bucket string
	prefix string // "" or "a/b" (no slashes at the ends)
	name   string
	// secrets are redacted from every error.
	secrets []string
}

var (
	_ Store   = (*s3Store)(nil)
	_ GCStore = (*s3Store)(nil)
)

// s3Config merges the environment under the explicit options.
func s3Config(scheme string, o S3Options, getenv func(string) string) (S3Options, error) {
	env := "STORAGE_S3_"
	if scheme == "minio" {
		env = "STORAGE_MINIO_"
	}
	pick := func(v *string, key string) {
		if *v == "" {
			*v = getenv(env + key)
		}
	}
	pick(&o.Endpoint, "ENDPOINT")
	pick(&o.AccessKeyID, "ACCESS_KEY_ID")
	pick(&o.SecretAccessKey, "SECRET_ACCESS_KEY")
	pick(&o.SessionToken, "SESSION_TOKEN")
	pick(&o.Bucket, "BUCKET_NAME")
	pick(&o.Region, "REGION")
	pick(&o.Prefix, "PREFIX")
	if o.UseSSL == nil {
		b, err := envBool(getenv(env + "USE_SSL"))
		if err != nil {
			return o, fmt.Errorf("%sUSE_SSL: %w", env, err)
		}
		o.UseSSL = b
	}
	if u, err := url.Parse(o.Endpoint); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		secure := u.Scheme == "https"
		if o.UseSSL == nil {
			o.UseSSL = &secure
		}
		o.Endpoint = u.Host
	}
	if o.UseSSL == nil {
		t := true
		o.UseSSL = &t
	}
	if o.Endpoint == "" {
		if scheme == "minio" {
			return o, fmt.Errorf("minio store: no endpoint (set STORAGE_MINIO_ENDPOINT): %w", errdefs.ErrInvalidArgument)
		}
		o.Endpoint = "s3.amazonaws.com"
	}
	return o, nil
}

func newS3FromURL(ctx context.Context, scheme, bucket, p string, opts Options) (Store, error) {
	o := opts.S3
	if scheme == "minio" {
		o = opts.MinIO
	}
	o, err := s3Config(scheme, o, opts.Getenv)
	if err != nil {
		return nil, err
	}
	if bucket == "" {
		bucket = o.Bucket
	}
	if bucket == "" {
		return nil, fmt.Errorf("%s store: no bucket in the url or the environment: %w", scheme, errdefs.ErrInvalidArgument)
	}
	p = strings.Trim(p, "/")
	dir, name := path.Split(p)
	if name == "" {
		return nil, fmt.Errorf("%s store: url needs a name after the bucket (%s://bucket/[prefix/]name:tag): %w", scheme, scheme, errdefs.ErrInvalidArgument)
	}
	prefix := strings.Trim(path.Join(o.Prefix, dir), "/")
	return NewS3Store(o, bucket, prefix, name, opts)
}

// NewS3Store returns the store for name under bucket/prefix on an S3 or
// MinIO endpoint. Transport and retries come from opts (minio-go's own
// retries are turned off; the caller's store wrapper retries). Without keys
// requests are anonymous: no cloud metadata endpoint is ever asked.
func NewS3Store(o S3Options, bucket, prefix, name string, opts Options) (Store, error) {
	if o.UseSSL == nil {
		t := true
		o.UseSSL = &t
	}
	opts = opts.withDefaults()
	if strings.Contains(name, "/") || name == "." || name == ".." || name == "" {
		return nil, fmt.Errorf("s3 store: invalid name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	mo := &minio.Options{
		Creds:      credentials.NewStaticV4(o.AccessKeyID, o.SecretAccessKey, o.SessionToken),
		Secure:     *o.UseSSL,
		Region:     o.Region,
		MaxRetries: 1,
		Transport:  opts.HTTPClient.Transport,
	}
	c, err := minio.New(o.Endpoint, mo)
	if err != nil {
		return nil, fmt.Errorf("s3 client for %s: %w", o.Endpoint, err)
	}
	return &s3Store{c: c, bucket: bucket, prefix: strings.Trim(prefix, "/"), name: name,
		secrets: []string{o.SecretAccessKey, o.SessionToken}}, nil
}

func (s *s3Store) key(parts ...string) string {
	return path.Join(append([]string{s.prefix}, parts...)...)
}

func (s *s3Store) blobKey(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("digest %q: %w: %w", d, err, errdefs.ErrInvalidArgument)
	}
	return s.key("blobs", d.Algorithm().String(), d.Encoded()), nil
}

// s3Err adds the object to a minio error and maps it to errdefs.
// s3Err maps minio's errors to errdefs, redacted: an endpoint's answer can
// quote a signed URL, and must never echo the node's keys.
func (s *s3Store) s3Err(op, key string, err error) error {
	return redact.Error(s.mapErr(op, key, err), s.secrets...)
}

func (s *s3Store) mapErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	r := minio.ToErrorResponse(err)
	switch {
	case r.Code == minio.NoSuchBucket:
		return fmt.Errorf("%s s3://%s/%s: bucket %s does not exist: %w", op, s.bucket, key, s.bucket, errdefs.ErrNotFound)
	case r.Code == minio.NoSuchKey || r.StatusCode == 404:
		return fmt.Errorf("%s s3://%s/%s: %w", op, s.bucket, key, errdefs.ErrNotFound)
	case r.StatusCode != 0:
		return fmt.Errorf("%s s3://%s/%s: %w", op, s.bucket, key, &StatusError{Op: r.Code + " " + r.Message, StatusCode: r.StatusCode})
	}
	return fmt.Errorf("%s s3://%s/%s: %w", op, s.bucket, key, err)
}

func (s *s3Store) Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	key, err := s.blobKey(desc.Digest)
	if err != nil {
		return false, err
	}
	info, err := s.c.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		if err = s.s3Err("stat", key, err); errdefs.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	return desc.Size <= 0 || info.Size == desc.Size, nil
}

func (s *s3Store) Fetch(ctx context.Context, desc ocispec.Descriptor, offset, length int64) (io.ReadCloser, error) {
	key, err := s.blobKey(desc.Digest)
	if err != nil {
		return nil, err
	}
	if length == 0 {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	var o minio.GetObjectOptions
	switch {
	case length > 0:
		err = o.SetRange(offset, offset+length-1)
	case offset > 0:
		err = o.SetRange(offset, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", desc.Digest, err)
	}
	body, _, _, err := minio.Core{Client: s.c}.GetObject(ctx, s.bucket, key, o)
	if err != nil {
		return nil, s.s3Err("get", key, err)
	}
	return body, nil
}

func (s *s3Store) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	if ok, err := s.Exists(ctx, desc); err != nil || ok {
		return err
	}
	key, err := s.blobKey(desc.Digest)
	if err != nil {
		return err
	}
	v := desc.Digest.Verifier()
	cr := &countingReader{r: io.TeeReader(ctxReader{ctx, r}, v)}
	if _, err := s.c.PutObject(ctx, s.bucket, key, cr, desc.Size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
	}); err != nil {
		return s.s3Err("put", key, err)
	}
	if cr.n != desc.Size || !v.Verified() {
		// The object went up but is not what its name says: take it down.
		_ = s.c.RemoveObject(context.WithoutCancel(ctx), s.bucket, key, minio.RemoveObjectOptions{})
		return fmt.Errorf("push %s: content (%d bytes) does not match the descriptor: %w", desc.Digest, cr.n, errdefs.ErrDataLoss)
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (s *s3Store) refKey(tag string) string { return s.key("refs", s.name, tag) }

func (s *s3Store) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	if d, ok := isDigestRef(ref); ok {
		key, _ := s.blobKey(d)
		b, err := s.getSmall(ctx, key)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		return manifestDescriptor(d, b), nil
	}
	if err := validTag(ref); err != nil {
		return ocispec.Descriptor{}, err
	}
	return s.readRef(ctx, s.refKey(ref))
}

func (s *s3Store) readRef(ctx context.Context, key string) (ocispec.Descriptor, error) {
	b, err := s.getSmall(ctx, key)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	var d ocispec.Descriptor
	if err := json.Unmarshal(b, &d); err != nil || d.Digest.Validate() != nil {
		return ocispec.Descriptor{}, fmt.Errorf("reference s3://%s/%s is corrupt: %w", s.bucket, key, errdefs.ErrDataLoss)
	}
	return d, nil
}

func (s *s3Store) getSmall(ctx context.Context, key string) ([]byte, error) {
	body, _, _, err := minio.Core{Client: s.c}.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.s3Err("get", key, err)
	}
	defer body.Close()
	b, err := readLimited(body, maxManifestSize)
	if err != nil {
		return nil, s.s3Err("get", key, err)
	}
	return b, nil
}

func (s *s3Store) Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error {
	if err := validTag(ref); err != nil {
		return err
	}
	if ok, err := s.Exists(ctx, desc); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("tag %s: manifest %s is not in the store: %w", ref, desc.Digest, errdefs.ErrFailedPrecondition)
	}
	desc.Annotations = nil
	b, err := json.Marshal(desc)
	if err != nil {
		return err
	}
	key := s.refKey(ref)
	_, err = s.c.PutObject(ctx, s.bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{ContentType: ocispec.MediaTypeDescriptor})
	return s.s3Err("put", key, err)
}

func (s *s3Store) Tags(ctx context.Context) ([]string, error) {
	var tags []string
	dir := s.key("refs", s.name) + "/"
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: dir}) {
		if o.Err != nil {
			return nil, s.s3Err("list", dir, o.Err)
		}
		tags = append(tags, strings.TrimPrefix(o.Key, dir))
	}
	slices.Sort(tags)
	return tags, nil
}

func (s *s3Store) Untag(ctx context.Context, ref string) error {
	if err := validTag(ref); err != nil {
		return err
	}
	key := s.refKey(ref)
	if _, err := s.c.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{}); err != nil {
		return s.s3Err("stat", key, err)
	}
	return s.s3Err("delete", key, s.c.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}))
}

// Roots returns the manifests of every name under the prefix: they share the
// blob pool, so garbage collection must keep what any of them reaches.
func (s *s3Store) Roots(ctx context.Context) ([]ocispec.Descriptor, error) {
	var roots []ocispec.Descriptor
	dir := s.key("refs") + "/"
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: dir, Recursive: true}) {
		if o.Err != nil {
			return nil, s.s3Err("list", dir, o.Err)
		}
		d, err := s.readRef(ctx, o.Key)
		if err != nil {
			if errdefs.IsNotFound(err) {
				continue // untagged meanwhile
			}
			return nil, err
		}
		roots = append(roots, d)
	}
	return roots, nil
}

func (s *s3Store) Blobs(ctx context.Context, fn func(BlobInfo) error) error {
	dir := s.key("blobs", "sha256") + "/"
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: dir}) {
		if o.Err != nil {
			return s.s3Err("list", dir, o.Err)
		}
		d := digest.NewDigestFromEncoded(digest.SHA256, strings.TrimPrefix(o.Key, dir))
		if d.Validate() != nil {
			continue
		}
		if err := fn(BlobInfo{Digest: d, Size: o.Size, ModTime: o.LastModified}); err != nil {
			return err
		}
	}
	return nil
}

func (s *s3Store) Delete(ctx context.Context, d digest.Digest) error {
	key, err := s.blobKey(d)
	if err != nil {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return s.s3Err("delete", key, err)
	}
	return nil
}
