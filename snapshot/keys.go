package snapshot

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/containerd/errdefs"
	"golang.org/x/crypto/hkdf"

	"github.com/cryo-runtime/cryo/internal/tenant"
)

// maxKeyFile bounds what a key loader reads.
const maxKeyFile = 64 << 10

func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, maxKeyFile+1)
	n, err := readFull(f, b)
	if err != nil {
		return nil, err
	}
	if n > maxKeyFile {
		return nil, fmt.Errorf("key file over %d bytes: %w", maxKeyFile, errdefs.ErrInvalidArgument)
	}
	return b[:n], nil
}

// LoadEncryptionKey reads a 32-byte AES-256 key from path: either 32 raw
// bytes or 64 hex digits (a trailing newline is allowed).
func LoadEncryptionKey(path string) ([]byte, error) {
	b, err := readKeyFile(path)
	if err != nil {
		return nil, fmt.Errorf("load encryption key: %w", err)
	}
	return parseEncryptionKey(b, path)
}

func parseEncryptionKey(b []byte, path string) ([]byte, error) {
	if len(b) == 32 {
		return b, nil
	}
	if t := bytes.TrimSpace(b); len(t) == 64 {
		if k, err := hex.DecodeString(string(t)); err == nil {
			return k, nil
		}
	}
	return nil, fmt.Errorf("load encryption key %s: want 32 raw bytes or 64 hex digits: %w", path, errdefs.ErrInvalidArgument)
}

// LoadNamespaceKey reads namespace ns's encryption key from dir/ns: the
// key that alone encrypts and decrypts that namespace's snapshots. Neither
// dir nor the file may be a symbolic link; both must belong to root and be
// closed to group and others (the file 0600 or stricter, the directory not
// writable by them), as a key anyone else could swap or read protects
// nothing. A FIFO or device in the key's place is refused without blocking.
func LoadNamespaceKey(dir, ns string) ([]byte, error) {
	if ns == "" {
		return nil, fmt.Errorf("load namespace key: the sandbox has no namespace to choose a key from %s by: %w", dir, errdefs.ErrFailedPrecondition)
	}
	if err := tenant.CheckNamespace(ns); err != nil {
		return nil, fmt.Errorf("load namespace key: %w", err)
	}
	if err := checkKeyOwner(dir, true); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, ns)
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("load namespace key: no key for namespace %q (%s): %w", ns, path, errdefs.ErrNotFound)
		}
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("load namespace key %s: a symbolic link: %w", path, errdefs.ErrPermissionDenied)
		}
		return nil, fmt.Errorf("load namespace key %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("load namespace key %s: not a regular file (%s): %w", path, st.Mode().Type(), errdefs.ErrPermissionDenied)
	}
	if err := ownedByRoot(path, st, 0o077); err != nil {
		return nil, err
	}
	b := make([]byte, maxKeyFile+1)
	n, err := readFull(f, b)
	if err != nil {
		return nil, fmt.Errorf("load namespace key %s: %w", path, err)
	}
	if n > maxKeyFile {
		return nil, fmt.Errorf("load namespace key %s: over %d bytes: %w", path, maxKeyFile, errdefs.ErrInvalidArgument)
	}
	return parseEncryptionKey(b[:n], path)
}

// checkKeyOwner refuses a symbolic link at path and, for a directory, one
// that group or others may write.
func checkKeyOwner(path string, dir bool) error {
	st, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("load namespace key: %w", err)
	}
	switch {
	case st.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("load namespace key: %s is a symbolic link: %w", path, errdefs.ErrPermissionDenied)
	case dir && !st.IsDir():
		return fmt.Errorf("load namespace key: %s is not a directory: %w", path, errdefs.ErrInvalidArgument)
	case dir:
		return ownedByRoot(path, st, 0o022)
	}
	return nil
}

func ownedByRoot(path string, st os.FileInfo, forbidden os.FileMode) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || sys.Uid != 0 {
		return fmt.Errorf("load namespace key: %s must belong to root: %w", path, errdefs.ErrPermissionDenied)
	}
	if st.Mode().Perm()&forbidden != 0 {
		return fmt.Errorf("load namespace key: %s has mode %v, must not give group or others %v: %w", path, st.Mode().Perm(), forbidden, errdefs.ErrPermissionDenied)
	}
	return nil
}

// TenantKey derives namespace ns's key from a node-wide key (HKDF-SHA256,
// info "cryo tenant key v1\0" + ns): with one node key, every namespace
// still seals and opens its snapshots with a key of its own, so the shim
// of one namespace cannot decrypt another's chunks.
func TenantKey(nodeKey []byte, ns string) []byte {
	k := make([]byte, 32)
	r := hkdf.New(sha256.New, nodeKey, nil, []byte("cryo tenant key v1\x00"+ns))
	if _, err := io.ReadFull(r, k); err != nil {
		panic(err) // HKDF-SHA256 yields up to 8160 bytes
	}
	return k
}

// NewLineage returns a random lineage ([Encryption].Lineage).
func NewLineage() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

var lineageRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

func checkLineage(l string) error {
	if !lineageRE.MatchString(l) {
		return fmt.Errorf("encryption.lineage %q: want 32 lowercase hex digits: %w", l, errdefs.ErrInvalidArgument)
	}
	return nil
}

// KeyID identifies an encryption key in Metadata without revealing it.
func KeyID(key []byte) string {
	h := sha256.Sum256(append([]byte("cryo key id v1\x00"), key...))
	return "sha256:" + hex.EncodeToString(h[:16])
}

// LoadSigningKey reads an Ed25519 private key from a PEM file ("PRIVATE KEY",
// PKCS #8, as written by `openssl genpkey -algorithm ed25519` and by
// GenerateSigningKey).
func LoadSigningKey(path string) (ed25519.PrivateKey, error) {
	b, err := readKeyFile(path)
	if err != nil {
		return nil, fmt.Errorf("load signing key: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("load signing key %s: no PEM PRIVATE KEY block: %w", path, errdefs.ErrInvalidArgument)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load signing key %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("load signing key %s: %T is not Ed25519: %w", path, k, errdefs.ErrInvalidArgument)
	}
	return priv, nil
}

// LoadPublicKey reads an Ed25519 public key from a PEM file ("PUBLIC KEY",
// PKIX).
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	b, err := readKeyFile(path)
	if err != nil {
		return nil, fmt.Errorf("load public key: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("load public key %s: no PEM PUBLIC KEY block: %w", path, errdefs.ErrInvalidArgument)
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load public key %s: %w", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("load public key %s: %T is not Ed25519: %w", path, k, errdefs.ErrInvalidArgument)
	}
	return pub, nil
}

// GenerateSigningKey writes a new Ed25519 key pair as PEM: the private key
// to privPath (0600) and the public key to pubPath (0644). Existing files
// are not overwritten.
func GenerateSigningKey(privPath, pubPath string) error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	pk, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return err
	}
	if err := writeNew(privPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o600); err != nil {
		return fmt.Errorf("generate signing key: %w", err)
	}
	if err := writeNew(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pk}), 0o644); err != nil {
		return fmt.Errorf("generate signing key: %w", err)
	}
	return nil
}

// GenerateEncryptionKey writes a new random 32-byte key to path (0600).
func GenerateEncryptionKey(path string) error {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return err
	}
	if err := writeNew(path, k, 0o600); err != nil {
		return fmt.Errorf("generate encryption key: %w", err)
	}
	return nil
}

func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}
