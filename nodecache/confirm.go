package nodecache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/cryo-runtime/cryo/stores"
)

// The blob cache is shared by every tenant of the node, but a tenant gets
// a cached blob only once its own store has confirmed that it holds it
// (by serving it, or by answering Exists): a blob another tenant's store
// brought in is never handed out by digest alone, and the cache answers
// no question about what others cached. Confirmations are remembered per
// store on disk, so clones of one snapshot in one store still download
// and ask once:
//
//	<dir>/confirmed/<storeid>/<hex>   the store <storeid> holds blob sha256:<hex>
//
// A store id (StoreID) is a hash of the store's URL without its reference
// or credentials.

// StoreID is a stable id of the store a URL names: a hash of its scheme,
// host and path without the reference (":tag" or "@sha256:..."), user
// info, query and fragment. Different references into one store share it.
func StoreID(rawURL string) string {
	key := rawURL
	if u, err := url.Parse(rawURL); err == nil {
		base := u.Path
		if b, _, err := stores.SplitRef(u.Path); err == nil {
			base = b
		}
		key = strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host) + "/" + strings.Trim(base, "/")
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// validStoreID accepts what StoreID makes.
func validStoreID(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

type confKey struct {
	store string
	d     digest.Digest
}

// confirmed reports whether store has confirmed holding d (in memory, or
// by a marker another process of the node wrote).
func (c *Blobs) confirmed(store string, d digest.Digest) bool {
	if !validStoreID(store) || stores.CheckDigest(d) != nil {
		return false
	}
	k := confKey{store, d}
	c.mu.Lock()
	_, ok := c.conf[k]
	c.mu.Unlock()
	if ok {
		return true
	}
	if info, err := c.root.Lstat("confirmed/" + store + "/" + d.Encoded()); err != nil || !info.Mode().IsRegular() {
		return false
	}
	c.mu.Lock()
	c.conf[k] = struct{}{}
	c.mu.Unlock()
	return true
}

// confirm records that store holds d, in memory and, if persist, in a
// marker file written atomically (temp file and rename), 0600 in a 0700
// directory.
func (c *Blobs) confirm(store string, d digest.Digest, persist bool) error {
	if !validStoreID(store) || stores.CheckDigest(d) != nil {
		return nil
	}
	if !persist {
		c.mu.Lock()
		c.conf[confKey{store, d}] = struct{}{}
		c.mu.Unlock()
		return nil
	}
	dir, err := c.root.MkdirAll("confirmed/"+store, 0o700)
	if err != nil {
		return err
	}
	defer dir.Close()
	tmp := ".tmp-" + randomSuffix()
	f, err := dir.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	if err := dir.Rename(tmp, dir, d.Encoded()); err != nil {
		dir.Remove(tmp)
		return err
	}
	c.mu.Lock()
	c.conf[confKey{store, d}] = struct{}{}
	c.mu.Unlock()
	return nil
}

// pruneConfirmations removes the markers of blobs no longer cached, and
// temp files older than an hour. Returns the markers removed.
func (c *Blobs) pruneConfirmations() (int, error) {
	top, err := c.root.Sub("confirmed")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer top.Close()
	storeDirs, err := top.ReadDir()
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, sd := range storeDirs {
		if !sd.IsDir() || !validStoreID(sd.Name()) {
			continue
		}
		dir, err := top.Sub(sd.Name())
		if err != nil {
			continue
		}
		ents, _ := dir.ReadDir()
		for _, e := range ents {
			name := e.Name()
			if strings.HasPrefix(name, ".tmp-") {
				if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
					dir.Remove(name)
				}
				continue
			}
			d := digest.NewDigestFromEncoded(digest.SHA256, name)
			if stores.CheckDigest(d) == nil && c.Has(d) {
				continue
			}
			if dir.Remove(name) == nil {
				removed++
				c.mu.Lock()
				delete(c.conf, confKey{sd.Name(), d})
				c.mu.Unlock()
			}
		}
		dir.Close()
	}
	return removed, nil
}
