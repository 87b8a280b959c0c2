// Package snapshot is the cryo checkpoint format: a sandbox's guest RAM,
// writable disks, QEMU device state and specs stored as a content-addressed,
// chunked, compressed, optionally encrypted and signed OCI artifact.
//
// Layout of one snapshot (see DESIGN.md, "Snapshot format"):
//
//   - an OCI image manifest with artifactType [ArtifactType];
//   - a config blob ([MediaTypeConfig]) holding [Metadata];
//   - one layer per stored chunk. Every file of the snapshot ("ram",
//     "disk:<name>", "devstate", "spec") is cut at fixed ChunkSize offsets;
//     chunks that are holes or all zeros are left out; every other chunk is an
//     independent zstd frame (then AES-256-GCM sealed when encrypted) whose
//     digest is the sha256 of the stored bytes. The layer annotations
//     [AnnotationFile], [AnnotationOffset] and [AnnotationSize] say where the
//     chunk's raw bytes go; the logical size of every file is in the config.
//
// Delta chunks (format version 2). A placed layer of media type
// [MediaTypeDelta] (or [MediaTypeDeltaEncrypted]) holds only the 4 KiB
// pages ([PageSize]) in which its chunk differs from a base chunk, named by
// digest in [AnnotationBase]; its other annotations are a full chunk's. The
// base is a full chunk of the same raw size listed in the SAME manifest as
// a base layer: full-chunk media type, [AnnotationRole] = [RoleBase],
// [AnnotationSize], and no file or offset (it is not placed; its deltas
// place it). So every blob a snapshot needs is one of its layers, and
// stores, garbage collection, export and copies need not know about
// deltas. A base is never a delta (depth 1), is listed once, is used by at
// least one delta, and in an encrypted snapshot by exactly one. Base layers
// follow the placed layers. A delta's raw payload is the sha256 of the
// whole raw chunk it rebuilds (32 bytes), a bitmap of its pages
// (ceil(pages/8) bytes, page i is bit i%8 of byte i/8), then those pages in
// order (the chunk's last page may be short); it holds at least one page
// and is never longer than the chunk. It is compressed and sealed like a
// chunk, with AAD "cryo-delta-v1\0" + file + "\0" + be64(offset) +
// be64(rawSize) + base digest, so it cannot move nor change base. A reader
// fetches and decodes each base once, applies each delta's pages to a copy
// and checks the sha256 before writing. A snapshot without deltas is
// written as version 1, which older readers restore; they refuse version 2
// by its version. Write makes deltas from a [PageIndex] of the previous
// snapshot (WriteOptions.Base).
//
// Publishing ([Write]) pushes chunks, then the config, then the manifest, then
// (when signing) the signature, and tags the reference last. Reading ([Open])
// verifies the manifest and config and validates every field before anything
// is used; [Snapshot.Materialize] verifies every chunk before writing it.
package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/opencontainers/go-digest"
)

// Media types and annotation keys of the format.
const (
	// ArtifactType is the manifest's artifactType.
	ArtifactType = "application/vnd.cryo.checkpoint.v1"
	// MediaTypeConfig is the media type of the config blob ([Metadata], JSON).
	MediaTypeConfig = "application/vnd.cryo.checkpoint.config.v1+json"
	// MediaTypeChunk is a chunk stored as one zstd frame.
	MediaTypeChunk = "application/vnd.cryo.chunk.v1+zstd"
	// MediaTypeChunkEncrypted is a zstd frame sealed with AES-256-GCM: the
	// stored bytes are nonce (12 bytes) || ciphertext || tag (16 bytes).
	MediaTypeChunkEncrypted = "application/vnd.cryo.chunk.v1+zstd+aes256gcm"

	// AnnotationFile names the file a chunk belongs to ("ram", "disk:<name>",
	// "devstate", "spec").
	AnnotationFile = "dev.cryo.chunk.file"
	// AnnotationOffset is the chunk's raw offset in its file (decimal).
	AnnotationOffset = "dev.cryo.chunk.offset"
	// AnnotationSize is the chunk's raw (decompressed) size (decimal).
	AnnotationSize = "dev.cryo.chunk.size"

	// MediaTypeDelta is a delta chunk (see the package doc) stored as one
	// zstd frame.
	MediaTypeDelta = "application/vnd.cryo.chunk.delta.v1+zstd"
	// MediaTypeDeltaEncrypted is a delta chunk's zstd frame sealed with
	// AES-256-GCM, laid out as [MediaTypeChunkEncrypted].
	MediaTypeDeltaEncrypted = "application/vnd.cryo.chunk.delta.v1+zstd+aes256gcm"
	// AnnotationBase, on a delta layer, is the digest of its base chunk.
	AnnotationBase = "dev.cryo.chunk.base"
	// AnnotationRole, on a full chunk layer, says that the layer is not
	// placed in any file: with the value [RoleBase] it is only the base of
	// the delta layers that name it.
	AnnotationRole = "dev.cryo.chunk.role"
	// RoleBase is the only value of [AnnotationRole].
	RoleBase = "base"

	// AnnotationPauseWindow, in [Metadata].Annotations, is how long the
	// checkpoint stopped the guest, as a Go duration ("23.4ms").
	AnnotationPauseWindow = "dev.cryo.pause-window"
	// AnnotationUploadedBytes, in [Metadata].Annotations, is what writing
	// the snapshot pushed (decimal): the stored bytes of the chunks the
	// store did not have yet, the cost of this checkpoint beside its
	// parents. Write sets it with [WriteOptions].AnnotateUploaded; the
	// config and manifest, pushed after the config is made, are not in it.
	AnnotationUploadedBytes = "dev.cryo.uploaded-bytes"

	// FormatVersion is the newest format version this package writes and
	// reads. Version 2 adds delta chunks; Write marks a plaintext snapshot
	// without any as version 1 ([FormatVersionNoDelta]), which older
	// readers restore, and one with deltas as version 2, which they
	// refuse. Version 3 ([FormatVersionLineage]) is every encrypted
	// snapshot Write makes, with or without deltas: its chunks' AAD binds
	// [Encryption].Lineage. Encrypted snapshots of versions 1 and 2 are
	// still read.
	FormatVersion = 3
	// FormatVersionNoDelta is the version of a snapshot without deltas.
	FormatVersionNoDelta = 1
	// FormatVersionDelta is the first version with delta chunks.
	FormatVersionDelta = 2
	// FormatVersionLineage is the first version whose sealed chunks bind
	// the snapshot's lineage (encrypted snapshots only).
	FormatVersionLineage = 3
	// PageSize is the unit of a delta chunk.
	PageSize = 4096
	// DefaultChunkSize is the chunk size used when WriteOptions leave it 0,
	// and the node config's default (configs: [snapshot] chunk_size): a
	// lazy restore fetches what a page fault needs and little more.
	DefaultChunkSize = 1 << 20
	// MinChunkSize and MaxChunkSize bound the chunk size; it must also be a
	// power of two.
	MinChunkSize = 64 << 10
	MaxChunkSize = 64 << 20
)

// File names inside a snapshot.
const (
	FileRAM      = "ram"
	FileDevState = "devstate"
	FileSpec     = "spec"
	diskPrefix   = "disk:"
)

// DiskFile returns the snapshot file name of the writable disk called name.
func DiskFile(name string) string { return diskPrefix + name }

var diskNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// validFileName reports whether name is a file name the format allows. Disk
// names never contain '/' or "..", so they are safe to use as path elements.
func validFileName(name string) error {
	switch name {
	case FileRAM, FileDevState, FileSpec:
		return nil
	}
	if d, ok := strings.CutPrefix(name, diskPrefix); ok && diskNameRE.MatchString(d) {
		return nil
	}
	return fmt.Errorf("file name %q: %w", name, errdefs.ErrInvalidArgument)
}

// Metadata is the config blob of a snapshot.
type Metadata struct {
	// FormatVersion is set by Write: [FormatVersionLineage] when the
	// snapshot is encrypted, else [FormatVersionDelta] when it has delta
	// chunks, [FormatVersionNoDelta] when it has none.
	FormatVersion int `json:"formatVersion"`
	// Created is set by Write when zero.
	Created time.Time `json:"created"`
	// Expires is when the snapshot may be garbage collected (zero: never).
	Expires     time.Time               `json:"expires,omitzero"`
	Source      SourceInfo              `json:"source"`
	Fingerprint fingerprint.Fingerprint `json:"fingerprint"`
	Containers  []Container             `json:"containers,omitempty"`
	Network     Network                 `json:"network"`
	// Annotations are free-form labels of the caller.
	Annotations map[string]string `json:"annotations,omitempty"`
	// WorkingSet lists chunks of the "ram" file (indexes: offset /
	// ChunkSize) that a lazily restored guest touched, in the order it
	// first touched them: a lazy restore of this snapshot prefetches them
	// before the rest. Untrusted like every field: each index is in the
	// file, none twice.
	WorkingSet []int64 `json:"workingSet,omitempty"`

	// The fields below are set by Write.

	// ChunkSize is the raw size of every chunk but a file's last one.
	ChunkSize int64 `json:"chunkSize"`
	// Compression is always "zstd".
	Compression string `json:"compression"`
	// Encryption is nil for a plaintext snapshot.
	Encryption *Encryption `json:"encryption,omitempty"`
	// Files lists every file of the snapshot with its logical size.
	Files  []FileInfo `json:"files"`
	Totals Totals     `json:"totals"`
}

// PauseWindow is the pause window the snapshot's checkpoint recorded
// ([AnnotationPauseWindow]); ok is false when it recorded none. Open has
// validated it.
func (md *Metadata) PauseWindow() (_ time.Duration, ok bool) {
	d, has, err := pauseWindow(md.Annotations)
	return d, has && err == nil
}

// UploadedBytes is what writing the snapshot pushed
// ([AnnotationUploadedBytes]); ok is false when it was not recorded. Open
// has validated it.
func (md *Metadata) UploadedBytes() (_ int64, ok bool) {
	v, has := md.Annotations[AnnotationUploadedBytes]
	n, err := parseDec(v)
	return n, has && err == nil
}

func pauseWindow(a map[string]string) (_ time.Duration, has bool, _ error) {
	v, has := a[AnnotationPauseWindow]
	if !has {
		return 0, false, nil
	}
	d, err := time.ParseDuration(v)
	if err == nil && d < 0 {
		err = errors.New("negative")
	}
	return d, true, err
}

// Expired reports whether the snapshot has an expiry time before now.
func (md *Metadata) Expired(now time.Time) bool {
	return !md.Expires.IsZero() && md.Expires.Before(now)
}

// SourceInfo names the sandbox a snapshot was taken from.
type SourceInfo struct {
	SandboxID   string `json:"sandboxID,omitempty"`
	PodName     string `json:"podName,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	PodUID      string `json:"podUID,omitempty"`
	Node        string `json:"node,omitempty"`
	RuntimeType string `json:"runtimeType,omitempty"`
}

// Container records one container of the sandbox.
type Container struct {
	ID string `json:"id"`
	// Image is the image reference the container was created from.
	Image string `json:"image,omitempty"`
	// LayerChain is the chain of the image's layer digests (bottom first).
	LayerChain []digest.Digest `json:"layerChain,omitempty"`
	// Spec is the container's OCI runtime spec. It is stored in clear in the
	// config, so Write refuses it in an encrypted snapshot: put specs in the
	// "spec" file instead, which is encrypted with the chunks.
	Spec json.RawMessage `json:"spec,omitempty"`
}

// Network is the guest's network identity at checkpoint time.
type Network struct {
	Hostname   string      `json:"hostname,omitempty"`
	Interfaces []Interface `json:"interfaces,omitempty"`
	DNS        []string    `json:"dns,omitempty"`
}

// Interface is one guest network interface.
type Interface struct {
	Name      string   `json:"name"`
	MAC       string   `json:"mac,omitempty"`
	Addresses []string `json:"addresses,omitempty"` // CIDR notation
	Gateway   string   `json:"gateway,omitempty"`
}

// Encryption describes how the chunks are encrypted.
type Encryption struct {
	// Algorithm is "AES-256-GCM".
	Algorithm string `json:"algorithm"`
	// KeyID identifies the key the chunks are sealed with (see [KeyID])
	// without revealing it: with a node-wide key, the tenant's key derived
	// from it ([TenantKey]).
	KeyID string `json:"keyID"`
	// Tenant (version 3, optional) is the namespace the snapshot was
	// sealed for: a reader in another namespace refuses it by this name
	// (ReadOptions.Tenant). It is a label for a clear refusal; what keeps
	// tenants apart is the key (one per namespace, or [TenantKey] of the
	// node key), which this field cannot change.
	Tenant string `json:"tenant,omitempty"`
	// Lineage (version 3, required there) is 32 hex digits chosen at
	// random by the first checkpoint of a chain and inherited by its
	// incremental children. Every sealed chunk's AAD binds it, so chunks
	// of two snapshots of different lineages sealed with one key cannot
	// be spliced into one snapshot. Splicing chunks of snapshots of the
	// same lineage (generations of one chain) is not detected: only a
	// required signature defends against that.
	Lineage string `json:"lineage,omitempty"`
}

// FileInfo is one file of a snapshot.
type FileInfo struct {
	Name string `json:"name"`
	// Size is the logical size of the file once materialized.
	Size int64 `json:"size"`
	// Chunks is the number of stored chunks of the file.
	Chunks int `json:"chunks"`
}

// Totals sums up a snapshot.
type Totals struct {
	// RawBytes is the sum of the files' logical sizes.
	RawBytes int64 `json:"rawBytes"`
	// DataBytes is the raw size of the stored chunks.
	DataBytes int64 `json:"dataBytes"`
	// StoredBytes is the size of the stored chunks.
	StoredBytes int64 `json:"storedBytes"`
	// Chunks counts the placed chunks, full and delta; Deltas the delta
	// chunks among them; Bases the base layers (StoredBytes counts them).
	Chunks int `json:"chunks"`
	Deltas int `json:"deltas,omitempty"`
	Bases  int `json:"bases,omitempty"`
}

// Algorithm names used in Metadata.
const (
	compressionZstd = "zstd"
	algAES256GCM    = "AES-256-GCM"
)
