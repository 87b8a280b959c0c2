package snapshot

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cryo-runtime/cryo/stores"
)

// Signatures.
//
// A signature is its own small OCI artifact, stored with the snapshot and
// tagged "sha256-<hex of the snapshot manifest digest>.sig" (the tag scheme
// cosign uses). Its manifest has artifactType [ArtifactTypeSignature], a
// `subject` pointing at the snapshot manifest, the empty config, and one
// layer: a JSON [SignaturePayload] whose Signature is Ed25519 over
// "cryo-signature-v1\x00" + the snapshot manifest digest. It is a tag plus
// ordinary blobs and a manifest, so it works in every store kind (OCI
// layout, S3, registry, HTTP), needs no referrers API, is found from a
// pinned digest as well as from a tag, and cannot be inside the manifest it
// signs.
const (
	// ArtifactTypeSignature is the artifactType of a signature manifest.
	ArtifactTypeSignature = "application/vnd.cryo.signature.v1"
	// MediaTypeSignature is the media type of the SignaturePayload layer.
	MediaTypeSignature = "application/vnd.cryo.signature.v1+json"

	signatureDomain  = "cryo-signature-v1\x00"
	maxSignatureBlob = 64 << 10
)

// SignaturePayload is the signature layer.
type SignaturePayload struct {
	// Manifest is the signed snapshot manifest digest.
	Manifest digest.Digest `json:"manifest"`
	// KeyID is the sha256 of the PKIX public key, for diagnostics.
	KeyID string `json:"keyID"`
	// Signature is base64 Ed25519 over signatureDomain + Manifest.
	Signature string `json:"signature"`
}

// SignatureTag returns the tag under which the signature of the snapshot
// whose manifest digest is d is stored.
func SignatureTag(d digest.Digest) string {
	return strings.Replace(d.String(), ":", "-", 1) + ".sig"
}

// IsSignatureTag reports whether tag names a signature (a SignatureTag)
// rather than a snapshot.
func IsSignatureTag(tag string) bool {
	return strings.HasSuffix(tag, ".sig") && strings.HasPrefix(tag, "sha256-")
}

// PublicKeyID identifies an Ed25519 public key.
func PublicKeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return "sha256:" + hex.EncodeToString(h[:])
}

// Sign signs the snapshot manifest desc with key and publishes the signature
// to store (blobs, then manifest, then its tag). Signing again replaces the
// signature.
func Sign(ctx context.Context, store stores.Store, desc ocispec.Descriptor, key ed25519.PrivateKey) error {
	if err := stores.CheckDigest(desc.Digest); err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	pub := key.Public().(ed25519.PublicKey)
	sig := ed25519.Sign(key, []byte(signatureDomain+desc.Digest.String()))
	payload, err := json.Marshal(SignaturePayload{Manifest: desc.Digest, KeyID: PublicKeyID(pub),
		Signature: base64.StdEncoding.EncodeToString(sig)})
	if err != nil {
		return err
	}
	layer := ocispec.Descriptor{MediaType: MediaTypeSignature, Digest: sha256Digest(payload), Size: int64(len(payload))}
	empty := ocispec.DescriptorEmptyJSON
	subject := ocispec.Descriptor{MediaType: desc.MediaType, ArtifactType: desc.ArtifactType, Digest: desc.Digest, Size: desc.Size}
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: ArtifactTypeSignature,
		Config: empty, Layers: []ocispec.Descriptor{layer}, Subject: &subject}
	m.SchemaVersion = 2
	mb, err := json.Marshal(m)
	if err != nil {
		return err
	}
	md := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: ArtifactTypeSignature,
		Digest: sha256Digest(mb), Size: int64(len(mb))}
	empty.Data = nil
	for _, b := range []struct {
		d ocispec.Descriptor
		b []byte
	}{{empty, []byte("{}")}, {layer, payload}, {md, mb}} {
		if _, err := pushIfMissing(ctx, store, b.d, b.b); err != nil {
			return fmt.Errorf("sign %s: %w", desc.Digest, err)
		}
	}
	if err := store.Tag(ctx, md, SignatureTag(desc.Digest)); err != nil {
		return fmt.Errorf("sign %s: tag: %w", desc.Digest, err)
	}
	return nil
}

// verifySignature looks up the signature of the snapshot manifest desc and
// checks it with pub. It returns errdefs.ErrNotFound (wrapped) when there is
// no signature and errdefs.ErrUnauthenticated when there is a bad one.
func verifySignature(ctx context.Context, store stores.Store, desc ocispec.Descriptor, pub ed25519.PublicKey) error {
	sd, err := store.Resolve(ctx, SignatureTag(desc.Digest))
	if err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("no signature for %s: %w", desc.Digest, errdefs.ErrNotFound)
		}
		return fmt.Errorf("resolve signature of %s: %w", desc.Digest, err)
	}
	mb, err := fetchVerified(ctx, store, sd, maxSignatureBlob, 0, nil)
	if err != nil {
		return fmt.Errorf("signature manifest: %w", err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return fmt.Errorf("signature manifest: %v: %w", err, errdefs.ErrUnauthenticated)
	}
	if m.ArtifactType != ArtifactTypeSignature || m.Subject == nil || m.Subject.Digest != desc.Digest ||
		len(m.Layers) != 1 || m.Layers[0].MediaType != MediaTypeSignature {
		return fmt.Errorf("signature manifest %s does not sign %s: %w", sd.Digest, desc.Digest, errdefs.ErrUnauthenticated)
	}
	pb, err := fetchVerified(ctx, store, m.Layers[0], maxSignatureBlob, 0, nil)
	if err != nil {
		return fmt.Errorf("signature payload: %w", err)
	}
	var p SignaturePayload
	if err := json.Unmarshal(pb, &p); err != nil {
		return fmt.Errorf("signature payload: %v: %w", err, errdefs.ErrUnauthenticated)
	}
	sig, err := base64.StdEncoding.DecodeString(p.Signature)
	if err != nil || p.Manifest != desc.Digest || len(sig) != ed25519.SignatureSize ||
		!ed25519.Verify(pub, []byte(signatureDomain+desc.Digest.String()), sig) {
		return fmt.Errorf("signature of %s (key %s) does not verify with key %s: %w", desc.Digest, p.KeyID, PublicKeyID(pub), errdefs.ErrUnauthenticated)
	}
	return nil
}
