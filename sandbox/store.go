package sandbox

import (
	"net/url"

	"github.com/cryo-runtime/cryo/stores"
)

// storeOptions are the fetch options of a store that a sandbox of tenant
// opens at storeURL: a redirect is followed only to where the allowlist
// would let the sandbox go itself, or within the registry an oci:// store
// names (its blob paths are not store URLs). Stores the shim chose itself
// (trusted) are local and never redirect.
func storeOptions(policy StorePolicy, tenant, storeURL string, trusted bool) stores.Options {
	o := policy.FetchOptions()
	if trusted {
		return o
	}
	var registry string
	if u, err := url.Parse(storeURL); err == nil && u.Scheme == "oci" {
		registry = u.Host
	}
	o.Redirect = func(u *url.URL) error {
		if registry != "" && u.Host == registry {
			return nil
		}
		return policy.Allows(u.String(), tenant)
	}
	return o
}
