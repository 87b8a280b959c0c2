package snapshot

import (
	"fmt"

	"github.com/cryo-runtime/cryo/configs"
)

// ReadOptionsFromConfig loads the keys the node's [snapshot] section names
// and returns the options every read on the node must use, outside any
// namespace (with encryption_key_dir, no key decrypts).
func ReadOptionsFromConfig(c configs.Snapshot) (ReadOptions, error) {
	return ReadOptionsForNamespace(c, "")
}

// ReadOptionsForNamespace is ReadOptionsFromConfig for a sandbox of
// namespace ns: with encryption_key_dir, only ns's key decrypts.
func ReadOptionsForNamespace(c configs.Snapshot, ns string) (ReadOptions, error) {
	o := ReadOptions{RequireSignature: c.SignatureRequired(), RequireEncryption: c.EncryptionRequired()}
	if c.VerifyKey != "" {
		k, err := LoadPublicKey(c.VerifyKey)
		if err != nil {
			return o, fmt.Errorf("snapshot.verify_key: %w", err)
		}
		o.PublicKey = k
	}
	if o.RequireSignature && o.PublicKey == nil {
		return o, fmt.Errorf("snapshot.require_signature is set but snapshot.verify_key is not")
	}
	if c.EncryptionKeyDir != "" && ns == "" {
		return o, nil
	}
	k, err := encryptionKey(c, ns)
	if err != nil {
		return o, err
	}
	o.DecryptionKey = k
	return o, nil
}

// WriteOptionsFromConfig loads the signing and encryption keys the node's
// [snapshot] section names and returns the options of a checkpoint of a
// sandbox of namespace ns (with encryption_key_dir, encrypted with ns's
// key; "" has none).
func WriteOptionsFromConfig(c configs.Snapshot, ns string) (WriteOptions, error) {
	o := WriteOptions{ChunkSize: int64(c.ChunkSizeMiB) << 20, Level: c.CompressionLevel}
	if c.SigningKey != "" {
		k, err := LoadSigningKey(c.SigningKey)
		if err != nil {
			return o, fmt.Errorf("snapshot.signing_key: %w", err)
		}
		o.SigningKey = k
	}
	k, err := encryptionKey(c, ns)
	if err != nil {
		return o, err
	}
	if k == nil && c.EncryptionRequired() {
		return o, fmt.Errorf("snapshot: encryption is required but no key is configured")
	}
	o.EncryptionKey = k
	return o, nil
}

// encryptionKey is the node key, or ns's key from the key directory.
func encryptionKey(c configs.Snapshot, ns string) ([]byte, error) {
	switch {
	case c.EncryptionKeyDir != "":
		k, err := LoadNamespaceKey(c.EncryptionKeyDir, ns)
		if err != nil {
			return nil, fmt.Errorf("snapshot.encryption_key_dir: %w", err)
		}
		return k, nil
	case c.EncryptionKey != "":
		k, err := LoadEncryptionKey(c.EncryptionKey)
		if err != nil {
			return nil, fmt.Errorf("snapshot.encryption_key: %w", err)
		}
		return k, nil
	}
	return nil, nil
}
