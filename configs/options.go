package configs

import (
	"fmt"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// The node's TOML maps onto the libraries' option structs here, so that
// fetch and snapshot know nothing of the node's configuration layout.

// FetchOptions maps the [stores] section onto the stores' options; what the
// section leaves empty comes from the STORAGE_S3_* / STORAGE_MINIO_*
// environment when a store is opened.
func (c Stores) FetchOptions() stores.Options {
	o := stores.Options{MaxConcurrent: c.MaxConcurrentFetches}
	s3 := stores.S3Options{Endpoint: c.S3.Endpoint, AccessKeyID: c.S3.AccessKey, SecretAccessKey: c.S3.SecretKey, Region: c.S3.Region}
	if c.S3.Endpoint != "" {
		b := c.S3.UseSSL
		s3.UseSSL = &b
	}
	o.S3, o.MinIO = s3, s3
	o.Registry = stores.RegistryOptions{PlainHTTPHosts: c.Registry.PlainHTTP, Username: c.Registry.Username, Password: c.Registry.Password}
	return o
}

// CachingOptions are the node cache's options for reading the store at
// storeURL: its confirmations are remembered under its StoreID, and every
// download is bounded by download_deadline and min_download_rate_kib.
func (c Stores) CachingOptions(storeURL string) nodecache.CachingOptions {
	return nodecache.CachingOptions{
		StoreID:          nodecache.StoreID(storeURL),
		DownloadDeadline: c.DownloadDeadline.Duration,
		MinRate:          int64(c.MinDownloadRateKiB) << 10,
	}
}

// NodeCache opens the node cache that cache_dir and cache_size name.
func (s Snapshot) NodeCache() (*nodecache.Node, error) {
	return nodecache.Open(s.CacheDir, nodecache.Options{MaxBlobBytes: s.CacheMaxMiB << 20})
}

// ReadOptions loads the keys the [snapshot] section names and returns the
// options every read by a sandbox of namespace ns must use ("" outside any
// namespace: with encryption_key_dir, no key decrypts then).
func (c Snapshot) ReadOptions(ns string) (snapshot.ReadOptions, error) {
	o := snapshot.ReadOptions{RequireSignature: c.SignatureRequired(), RequireEncryption: c.EncryptionRequired()}
	if c.VerifyKey != "" {
		k, err := snapshot.LoadPublicKey(c.VerifyKey)
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
	o.Tenant = ns
	if c.EncryptionKeyDir == "" && c.EncryptionKey != "" {
		k, err := snapshot.LoadEncryptionKey(c.EncryptionKey)
		if err != nil {
			return o, fmt.Errorf("snapshot.encryption_key: %w", err)
		}
		o.NodeKey, o.LegacyNodeKey = k, c.LegacyNodeKey
		return o, nil
	}
	k, err := c.encryptionKey(ns)
	if err != nil {
		return o, err
	}
	o.DecryptionKey = k
	return o, nil
}

// WriteOptions loads the signing and encryption keys the [snapshot] section
// names and returns the options of a checkpoint of a sandbox of namespace
// ns (with encryption_key_dir, encrypted with ns's key; "" has none).
func (c Snapshot) WriteOptions(ns string) (snapshot.WriteOptions, error) {
	o := snapshot.WriteOptions{ChunkSize: int64(c.ChunkSizeMiB) << 20, Level: c.CompressionLevel}
	if c.SigningKey != "" {
		k, err := snapshot.LoadSigningKey(c.SigningKey)
		if err != nil {
			return o, fmt.Errorf("snapshot.signing_key: %w", err)
		}
		o.SigningKey = k
	}
	k, err := c.encryptionKey(ns)
	if err != nil {
		return o, err
	}
	if k == nil && c.EncryptionRequired() {
		return o, fmt.Errorf("snapshot: encryption is required but no key is configured")
	}
	o.EncryptionKey = k
	if k != nil {
		o.Tenant = ns
	}
	return o, nil
}

// encryptionKey is ns's key: from the key directory, or derived from the
// node key (snapshot.TenantKey), never the node key itself.
func (c Snapshot) encryptionKey(ns string) ([]byte, error) {
	switch {
	case c.EncryptionKeyDir != "":
		k, err := snapshot.LoadNamespaceKey(c.EncryptionKeyDir, ns)
		if err != nil {
			return nil, fmt.Errorf("snapshot.encryption_key_dir: %w", err)
		}
		return k, nil
	case c.EncryptionKey != "":
		k, err := snapshot.LoadEncryptionKey(c.EncryptionKey)
		if err != nil {
			return nil, fmt.Errorf("snapshot.encryption_key: %w", err)
		}
		return snapshot.TenantKey(k, ns), nil
	}
	return nil, nil
}
