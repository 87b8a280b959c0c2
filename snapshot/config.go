package snapshot

import (
	"fmt"

	"github.com/cryo-runtime/cryo/configs"
)

// ReadOptionsFromConfig loads the keys the node's [snapshot] section names
// and returns the options every read on the node must use.
func ReadOptionsFromConfig(c configs.Snapshot) (ReadOptions, error) {
	o := ReadOptions{RequireSignature: c.RequireSignature, RequireEncryption: c.RequireEncryption}
	if c.VerifyKey != "" {
		k, err := LoadPublicKey(c.VerifyKey)
		if err != nil {
			return o, fmt.Errorf("snapshot.verify_key: %w", err)
		}
		o.PublicKey = k
	}
	if c.RequireSignature && o.PublicKey == nil {
		return o, fmt.Errorf("snapshot.require_signature is set but snapshot.verify_key is not")
	}
	if c.EncryptionKey != "" {
		k, err := LoadEncryptionKey(c.EncryptionKey)
		if err != nil {
			return o, fmt.Errorf("snapshot.encryption_key: %w", err)
		}
		o.DecryptionKey = k
	}
	return o, nil
}

// WriteOptionsFromConfig loads the signing and encryption keys the node's
// [snapshot] section names and returns the options of a checkpoint.
func WriteOptionsFromConfig(c configs.Snapshot) (WriteOptions, error) {
	o := WriteOptions{ChunkSize: int64(c.ChunkSizeMiB) << 20, Level: c.CompressionLevel}
	if c.SigningKey != "" {
		k, err := LoadSigningKey(c.SigningKey)
		if err != nil {
			return o, fmt.Errorf("snapshot.signing_key: %w", err)
		}
		o.SigningKey = k
	}
	if c.EncryptionKey != "" {
		k, err := LoadEncryptionKey(c.EncryptionKey)
		if err != nil {
			return o, fmt.Errorf("snapshot.encryption_key: %w", err)
		}
		o.EncryptionKey = k
	}
	return o, nil
}
