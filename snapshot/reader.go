package snapshot

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/internal/tenant"
	"github.com/cryo-runtime/cryo/stores"
)

// ReadOptions are the reader's policy and limits. Zero limits mean the
// defaults in parentheses.
type ReadOptions struct {
	// PublicKey verifies the signature when there is one; a bad signature
	// is always refused.
	PublicKey ed25519.PublicKey
	// RequireSignature refuses a snapshot without a valid signature by
	// PublicKey (which must be set).
	RequireSignature bool
	// DecryptionKey (32 bytes) decrypts an encrypted snapshot. Open works
	// without it (to inspect metadata); Verify and Materialize need it.
	DecryptionKey []byte
	// NodeKey (32 bytes), instead of DecryptionKey, is a node-wide key:
	// a snapshot is decrypted with Tenant's key derived from it
	// ([TenantKey]), never with the node key itself unless
	// LegacyNodeKey.
	NodeKey []byte
	// Tenant is the namespace of the reader: a snapshot sealed for
	// another (Encryption.Tenant) is refused.
	Tenant string
	// AnyTenant skips the tenant check: with NodeKey, a snapshot is
	// decrypted with the key of the tenant it names. For an operator's
	// tool that holds the node key (cryoctl), never for a sandbox.
	AnyTenant bool
	// LegacyNodeKey lets NodeKey itself decrypt a snapshot that an older
	// cryo sealed with it for every namespace alike (no tenant key):
	// refused otherwise, naming [snapshot] legacy_node_key.
	LegacyNodeKey bool
	// RequireEncryption refuses a plaintext snapshot.
	RequireEncryption bool
	// RefuseExpired refuses a snapshot past its Expires time (garbage
	// collection may remove its blobs at any moment).
	RefuseExpired bool

	MaxManifestSize int64 // (16 MiB)
	MaxConfigSize   int64 // (1 MiB)
	MaxLayers       int   // (262144)
	MaxFileSize     int64 // per file (4 TiB)
	MaxChunkSize    int64 // (MaxChunkSize)
	// MaxFiles bounds the files a snapshot may list, each of which
	// Materialize creates (64).
	MaxFiles int
	// MaxSpecSize bounds the "spec" file, which ReadFile reads into
	// memory, and every container spec in the config (1 MiB).
	MaxSpecSize int64
	// MaxVCPUs and MaxMemoryMiB are this node's limits on the VM a
	// snapshot describes: its fingerprint and the size of its "ram" file
	// (0: not checked, e.g. to inspect a snapshot of another node).
	MaxVCPUs     int
	MaxMemoryMiB int64
	// MaxDiskSize is this node's limit on a disk file's size in bytes
	// ([restore] max_disk_size): Open refuses a larger one before
	// anything is allocated for it (0: only MaxFileSize).
	MaxDiskSize int64

	// Workers fetch, verify and decompress chunks in parallel (2 x
	// GOMAXPROCS, fewer when MaxMemory asks for it).
	Workers int
	// MaxMemory bounds the chunk buffers of Verify and Materialize, and
	// those of the concurrent decodes of a snapshot's served files
	// (ServeFile) together; the decoded chunks they keep take at most half
	// as much again, at least two chunks (192 MiB).
	MaxMemory int64
	// RangeSize splits a chunk fetch into ranged reads of at most this
	// many bytes (0: one read per chunk).
	RangeSize int64
}

func (o *ReadOptions) defaults() {
	if o.MaxManifestSize <= 0 {
		o.MaxManifestSize = 16 << 20
	}
	if o.MaxConfigSize <= 0 {
		o.MaxConfigSize = 1 << 20
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = 64
	}
	if o.MaxSpecSize <= 0 {
		o.MaxSpecSize = 1 << 20
	}
	if o.MaxLayers <= 0 {
		o.MaxLayers = 1 << 18
	}
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = 4 << 40
	}
	if o.MaxChunkSize <= 0 || o.MaxChunkSize > MaxChunkSize {
		o.MaxChunkSize = MaxChunkSize
	}
	if o.Workers <= 0 {
		o.Workers = 2 * runtime.GOMAXPROCS(0)
	}
	if o.MaxMemory <= 0 {
		o.MaxMemory = 192 << 20
	}
}

// Snapshot is an opened, validated snapshot. Its Metadata and Manifest are
// verified against the manifest digest; its chunks are verified as they are
// read.
type Snapshot struct {
	// Ref is the reference it was opened by.
	Ref string
	// Descriptor is the manifest's descriptor; Descriptor.Digest pins the
	// whole snapshot.
	Descriptor ocispec.Descriptor
	Manifest   ocispec.Manifest
	Metadata   Metadata
	// Signed is true when a signature by ReadOptions.PublicKey verified.
	Signed bool

	store  stores.Store
	opts   ReadOptions
	chunks []chunkRef
	// deltas are the delta chunks, bases their base layers (delta.go).
	deltas []deltaRef
	bases  map[digest.Digest]baseRef
	// writeAt writes materialized bytes; tests inject failures here.
	writeAt func(f writerAt, b []byte, off int64) (int, error)
	// demand is when a served file's reader last waited for a chunk.
	demand *demandClock
	// serving is the served files' decode budget and decoded chunks.
	serving *serving
}

// chunkRef is one validated chunk layer.
type chunkRef struct {
	file      string
	off, size int64
	desc      ocispec.Descriptor
}

// ParseRef splits "tag", "tag@sha256:<hex>" or "sha256:<hex>" into a tag
// and a pinned manifest digest (either may be empty).
func ParseRef(ref string) (tag string, pin digest.Digest, err error) {
	tag = ref
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		tag, pin = ref[:i], digest.Digest(ref[i+1:])
	} else if strings.HasPrefix(ref, "sha256:") {
		tag, pin = "", digest.Digest(ref)
	}
	if pin != "" {
		if err := stores.CheckDigest(pin); err != nil {
			return "", "", fmt.Errorf("ref %q: %w", ref, err)
		}
	}
	if tag == "" && pin == "" {
		return "", "", fmt.Errorf("empty ref: %w", errdefs.ErrInvalidArgument)
	}
	return tag, pin, nil
}

// Open resolves ref in store ("tag", "tag@sha256:...", or "sha256:..."; a
// pinned digest wins over the tag), fetches the manifest and config,
// verifies their digests, the signature and the encryption policy, and
// validates every field before returning. Nothing is written.
func Open(ctx context.Context, store stores.Store, ref string, opts ReadOptions) (*Snapshot, error) {
	opts.defaults()
	s := &Snapshot{Ref: ref, store: store, opts: opts, demand: &demandClock{}}
	if err := s.open(ctx); err != nil {
		return nil, fmt.Errorf("open snapshot %s: %w", ref, err)
	}
	s.serving = newServing(s.Metadata.ChunkSize, opts.MaxMemory)
	return s, nil
}

func (s *Snapshot) open(ctx context.Context) error {
	if s.opts.RequireSignature && s.opts.PublicKey == nil {
		return fmt.Errorf("signature required but no public key configured: %w", errdefs.ErrInvalidArgument)
	}
	if k := s.opts.DecryptionKey; k != nil && len(k) != 32 {
		return fmt.Errorf("decryption key is %d bytes, want 32: %w", len(k), errdefs.ErrInvalidArgument)
	}
	if k := s.opts.NodeKey; k != nil && len(k) != 32 {
		return fmt.Errorf("node key is %d bytes, want 32: %w", len(k), errdefs.ErrInvalidArgument)
	}
	desc, err := resolve(ctx, s.store, s.Ref)
	if err != nil {
		return err
	}
	desc.MediaType = ocispec.MediaTypeImageManifest
	mb, err := fetchVerified(ctx, s.store, desc, s.opts.MaxManifestSize, 0, nil)
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	s.Descriptor = desc
	// The signature is checked before the manifest is even parsed.
	if s.opts.PublicKey != nil {
		switch err := verifySignature(ctx, s.store, desc, s.opts.PublicKey); {
		case err == nil:
			s.Signed = true
		case errdefs.IsNotFound(err) && !s.opts.RequireSignature:
		case errdefs.IsNotFound(err):
			return fmt.Errorf("unsigned, a signature is required: %w", errdefs.ErrUnauthenticated)
		default:
			return err
		}
	}
	if err := json.Unmarshal(mb, &s.Manifest); err != nil {
		return fmt.Errorf("manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	m := &s.Manifest
	if m.SchemaVersion != 2 || m.MediaType != ocispec.MediaTypeImageManifest || m.ArtifactType != ArtifactType {
		return fmt.Errorf("not a cryo snapshot (schemaVersion %d, mediaType %q, artifactType %q): %w",
			m.SchemaVersion, m.MediaType, m.ArtifactType, errdefs.ErrInvalidArgument)
	}
	if m.Config.MediaType != MediaTypeConfig {
		return fmt.Errorf("config media type %q: %w", m.Config.MediaType, errdefs.ErrInvalidArgument)
	}
	if len(m.Layers) > s.opts.MaxLayers {
		return fmt.Errorf("%d layers, limit %d: %w", len(m.Layers), s.opts.MaxLayers, errdefs.ErrInvalidArgument)
	}
	if err := validateAnnotations("manifest.annotations", m.Annotations); err != nil {
		return err
	}
	cb, err := fetchVerified(ctx, s.store, m.Config, s.opts.MaxConfigSize, 0, nil)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := json.Unmarshal(cb, &s.Metadata); err != nil {
		return fmt.Errorf("config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := s.validateMetadata(); err != nil {
		return err
	}
	return s.validateLayers()
}

// resolve finds the manifest descriptor of ref. A pinned digest is resolved
// by digest (stores resolve digests like oras does) or, failing that,
// through the tag, which must then name the pinned manifest.
func resolve(ctx context.Context, store stores.Store, ref string) (ocispec.Descriptor, error) {
	tag, pin, err := ParseRef(ref)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if pin != "" {
		desc, err := store.Resolve(ctx, pin.String())
		if err == nil && desc.Digest == pin {
			return desc, nil
		}
		if tag == "" {
			if err == nil {
				err = fmt.Errorf("store resolved %s to %s: %w", pin, desc.Digest, errdefs.ErrDataLoss)
			}
			return ocispec.Descriptor{}, fmt.Errorf("resolve %s: %w", pin, err)
		}
	}
	desc, err := store.Resolve(ctx, tag)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("resolve %s: %w", tag, err)
	}
	if pin != "" && desc.Digest != pin {
		return ocispec.Descriptor{}, fmt.Errorf("%s names %s, not the pinned %s: %w", tag, desc.Digest, pin, errdefs.ErrFailedPrecondition)
	}
	return desc, nil
}

func (s *Snapshot) validateMetadata() error {
	md := &s.Metadata
	if md.FormatVersion < FormatVersionNoDelta || md.FormatVersion > FormatVersion {
		return fmt.Errorf("format version %d, this cryo reads %d to %d: %w", md.FormatVersion, FormatVersionNoDelta, FormatVersion, errdefs.ErrNotImplemented)
	}
	if s.opts.RefuseExpired && md.Expired(time.Now()) {
		return fmt.Errorf("expired at %s: %w", md.Expires.Format(time.RFC3339), errdefs.ErrFailedPrecondition)
	}
	if md.Compression != compressionZstd {
		return fmt.Errorf("compression %q: %w", md.Compression, errdefs.ErrNotImplemented)
	}
	if err := checkChunkSize(md.ChunkSize); err != nil {
		return err
	}
	if md.ChunkSize > s.opts.MaxChunkSize {
		return fmt.Errorf("chunk size %d over limit %d: %w", md.ChunkSize, s.opts.MaxChunkSize, errdefs.ErrInvalidArgument)
	}
	if e := md.Encryption; e != nil {
		if err := s.chooseKey(e); err != nil {
			return err
		}
	} else if md.FormatVersion >= FormatVersionLineage {
		return fmt.Errorf("a version %d snapshot is encrypted, this one has no encryption: %w", md.FormatVersion, errdefs.ErrInvalidArgument)
	} else if s.opts.RequireEncryption {
		return fmt.Errorf("snapshot is not encrypted, encryption is required: %w", errdefs.ErrFailedPrecondition)
	}
	if err := checkCount("files", len(md.Files), s.opts.MaxFiles); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, f := range md.Files {
		if err := validFileName(f.Name); err != nil {
			return err
		}
		if seen[f.Name] {
			return fmt.Errorf("file %s listed twice: %w", f.Name, errdefs.ErrInvalidArgument)
		}
		seen[f.Name] = true
		if f.Size < 0 || f.Size > s.opts.MaxFileSize {
			return fmt.Errorf("file %s: size %d outside [0, %d]: %w", f.Name, f.Size, s.opts.MaxFileSize, errdefs.ErrInvalidArgument)
		}
		if err := s.checkFileLimit(f); err != nil {
			return err
		}
	}
	return s.validateFields()
}

// chooseKey validates the encryption fields and picks the key that
// decrypts the snapshot into s.opts.DecryptionKey (left nil without a
// configured key: Open still inspects, Materialize refuses).
func (s *Snapshot) chooseKey(e *Encryption) error {
	md := &s.Metadata
	if e.Algorithm != algAES256GCM {
		return fmt.Errorf("encryption %q: %w", e.Algorithm, errdefs.ErrNotImplemented)
	}
	if err := checkKeyID(e.KeyID); err != nil {
		return err
	}
	if md.FormatVersion >= FormatVersionLineage {
		if err := checkLineage(e.Lineage); err != nil {
			return err
		}
	} else if e.Lineage != "" || e.Tenant != "" {
		return fmt.Errorf("encryption.lineage or encryption.tenant in a version %d snapshot: %w", md.FormatVersion, errdefs.ErrInvalidArgument)
	}
	if e.Tenant != "" {
		if err := tenant.CheckNamespace(e.Tenant); err != nil {
			return fmt.Errorf("encryption.tenant: %w", err)
		}
		if e.Tenant != s.opts.Tenant && !s.opts.AnyTenant {
			in := fmt.Sprintf("namespace %q", s.opts.Tenant)
			if s.opts.Tenant == "" {
				in = "no namespace"
			}
			return fmt.Errorf("encryption.tenant: sealed for namespace %q, the reader is in %s: another namespace's snapshot is not restored: %w", e.Tenant, in, errdefs.ErrPermissionDenied)
		}
	}
	key := s.opts.DecryptionKey
	if nk := s.opts.NodeKey; nk != nil {
		ns := s.opts.Tenant
		if e.Tenant != "" {
			ns = e.Tenant // the reader's own, or AnyTenant
		}
		direct := key
		key = TenantKey(nk, ns)
		switch {
		case KeyID(key) == e.KeyID:
		case KeyID(nk) == e.KeyID && !s.opts.LegacyNodeKey:
			return fmt.Errorf("encrypted with the node key itself (%s), as cryo did before namespace keys were derived from it: any namespace of the node could decrypt it, so it is refused unless [snapshot] legacy_node_key = true: %w", e.KeyID, errdefs.ErrPermissionDenied)
		case KeyID(nk) == e.KeyID:
			key = nk
		case direct != nil && KeyID(direct) == e.KeyID:
			key = direct
		}
	}
	if key != nil && KeyID(key) != e.KeyID {
		return fmt.Errorf("encrypted with key %s, configured key is %s: %w", e.KeyID, KeyID(key), errdefs.ErrFailedPrecondition)
	}
	s.opts.DecryptionKey = key
	return nil
}

// checkFileLimit refuses a RAM file larger than the node's memory limit, a
// disk larger than MaxDiskSize and a spec file larger than MaxSpecSize.
func (s *Snapshot) checkFileLimit(f FileInfo) error {
	switch {
	case f.Name == FileRAM && s.opts.MaxMemoryMiB > 0 && f.Size > s.opts.MaxMemoryMiB<<20:
		return fmt.Errorf("files[ram].size %d: this node allows at most %d MiB of memory: %w", f.Size, s.opts.MaxMemoryMiB, errdefs.ErrInvalidArgument)
	case strings.HasPrefix(f.Name, diskPrefix) && s.opts.MaxDiskSize > 0 && f.Size > s.opts.MaxDiskSize:
		return fmt.Errorf("files[%s].size %d: this node serves and restores disks of at most %d MiB (restore.max_disk_size): %w", f.Name, f.Size, s.opts.MaxDiskSize>>20, errdefs.ErrInvalidArgument)
	case f.Name == FileSpec && f.Size > s.opts.MaxSpecSize:
		return fmt.Errorf("files[spec].size %d: at most %d: %w", f.Size, s.opts.MaxSpecSize, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validateLayers turns layers into chunks: every chunk of a known file, at
// a chunk-aligned offset inside the file, exactly as long as the chunk there
// is, at most once per offset, with the media type the encryption implies.
func (s *Snapshot) validateLayers() error {
	md := &s.Metadata
	sizes := map[string]int64{}
	counts := map[string]int{}
	for _, f := range md.Files {
		sizes[f.Name] = f.Size
	}
	wantType := MediaTypeChunk
	if md.Encryption != nil {
		wantType = MediaTypeChunkEncrypted
	}
	cs := md.ChunkSize
	used := map[string]map[int64]bool{}
	s.chunks = make([]chunkRef, 0, len(s.Manifest.Layers))
	var bases []int
	for i, l := range s.Manifest.Layers {
		bad := func(format string, a ...any) error {
			return fmt.Errorf("layer %d (%s): %s: %w", i, l.Digest, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
		}
		if _, ok := l.Annotations[AnnotationRole]; ok {
			bases = append(bases, i) // not placed: see linkDeltas
			continue
		}
		delta := s.isDelta(l)
		if l.MediaType != wantType && !delta {
			return bad("media type %q, want %q", l.MediaType, wantType)
		}
		if err := stores.CheckDigest(l.Digest); err != nil {
			return bad("%v", err)
		}
		if l.Size <= 0 || l.Size > maxStoredSize(cs) {
			return bad("stored size %d outside [1, %d]", l.Size, maxStoredSize(cs))
		}
		name := l.Annotations[AnnotationFile]
		fsize, ok := sizes[name]
		if !ok {
			return bad("file %q not in the config", name)
		}
		off, err1 := parseDec(l.Annotations[AnnotationOffset])
		size, err2 := parseDec(l.Annotations[AnnotationSize])
		if err1 != nil || err2 != nil {
			return bad("offset %q or size %q not a decimal", l.Annotations[AnnotationOffset], l.Annotations[AnnotationSize])
		}
		if off%cs != 0 || off >= fsize {
			return bad("offset %d not a multiple of %d inside %s (%d bytes)", off, cs, name, fsize)
		}
		if want := min(cs, fsize-off); size != want {
			return bad("raw size %d at offset %d of %s, want %d", size, off, name, want)
		}
		if used[name] == nil {
			used[name] = map[int64]bool{}
		}
		if used[name][off] {
			return bad("second chunk at offset %d of %s (overlap)", off, name)
		}
		used[name][off] = true
		counts[name]++
		if delta {
			s.deltas = append(s.deltas, deltaRef{chunkRef: chunkRef{file: name, off: off, size: size, desc: l}, layer: i})
			continue
		}
		s.chunks = append(s.chunks, chunkRef{file: name, off: off, size: size, desc: l})
	}
	for _, f := range md.Files {
		if counts[f.Name] != f.Chunks {
			return fmt.Errorf("file %s: %d chunks, config says %d: %w", f.Name, counts[f.Name], f.Chunks, errdefs.ErrInvalidArgument)
		}
	}
	return s.linkDeltas(bases)
}

// parseDec parses a canonical non-negative decimal (no sign, no leading
// zeros, at most 18 digits).
func parseDec(s string) (int64, error) {
	if s == "" || len(s) > 18 || (len(s) > 1 && s[0] == '0') {
		return 0, errdefs.ErrInvalidArgument
	}
	var n int64
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, errdefs.ErrInvalidArgument
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

// Encrypted reports whether the chunks are encrypted.
func (s *Snapshot) Encrypted() bool { return s.Metadata.Encryption != nil }

// Chunks returns the number of stored chunks.
func (s *Snapshot) Chunks() int { return len(s.chunks) + len(s.deltas) }

// ReadFile fetches, verifies and decodes the snapshot file name (e.g.
// [FileSpec]) into memory, without writing anything: a restore decodes
// its sandbox record before it creates anything on the host. A file
// larger than limit is refused before any chunk is fetched.
func (s *Snapshot) ReadFile(ctx context.Context, name string, limit int64) ([]byte, error) {
	sub, size, err := s.fileOnly(name, limit)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, size)
	// Chunks are validated to lie inside the file and never to overlap:
	// workers copy into disjoint ranges.
	put := func(c chunkRef, raw []byte) error { copy(buf[c.off:c.off+c.size], raw); return nil }
	if err := sub.forEachFileChunk(ctx, put); err != nil {
		return nil, fmt.Errorf("read %s of snapshot %s: %w", name, s.Descriptor.Digest, err)
	}
	return buf, nil
}

// CopyFile fetches, verifies and decodes the snapshot file name into dst
// (an empty file; its holes stay holes), chunk by chunk: its memory is
// the workers' chunk buffers (ReadOptions.MaxMemory), whatever the file's
// size. A file larger than limit is refused before anything is fetched or
// written. On error dst holds part of the file: the caller removes it.
func (s *Snapshot) CopyFile(ctx context.Context, name string, limit int64, dst *os.File) error {
	sub, size, err := s.fileOnly(name, limit)
	if err != nil {
		return err
	}
	if err := dst.Truncate(size); err != nil {
		return fmt.Errorf("copy %s of snapshot %s: %w", name, s.Descriptor.Digest, err)
	}
	put := func(c chunkRef, raw []byte) error {
		if err := writeSparse(func(f writerAt, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }, dst, raw, c.off); err != nil {
			return fmt.Errorf("write %s at %d: %w", name, c.off, err)
		}
		return nil
	}
	if err := sub.forEachFileChunk(ctx, put); err != nil {
		return fmt.Errorf("copy %s of snapshot %s: %w", name, s.Descriptor.Digest, err)
	}
	return nil
}

// fileOnly returns a view of the snapshot with only the chunks of file
// name, and its size, refusing a file larger than limit.
func (s *Snapshot) fileOnly(name string, limit int64) (*Snapshot, int64, error) {
	i := slices.IndexFunc(s.Metadata.Files, func(f FileInfo) bool { return f.Name == name })
	if i < 0 {
		return nil, 0, fmt.Errorf("snapshot has no file %s: %w", name, errdefs.ErrNotFound)
	}
	size := s.Metadata.Files[i].Size
	if size > limit {
		return nil, 0, fmt.Errorf("file %s: %d bytes, at most %d: %w", name, size, limit, errdefs.ErrInvalidArgument)
	}
	sub := *s
	sub.chunks = slices.DeleteFunc(slices.Clone(s.chunks), func(c chunkRef) bool { return c.file != name })
	sub.deltas = slices.DeleteFunc(slices.Clone(s.deltas), func(d deltaRef) bool { return d.file != name })
	return &sub, size, nil
}

// forEachFileChunk calls fn with every full chunk, then every delta chunk
// (which lie at other offsets).
func (s *Snapshot) forEachFileChunk(ctx context.Context, fn func(c chunkRef, raw []byte) error) error {
	if err := s.forEachChunk(ctx, fn); err != nil {
		return err
	}
	return s.forEachDelta(ctx, fn)
}
