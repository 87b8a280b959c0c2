package main

// All wiring from the node configuration (configs) and the global flags to
// the fetch and snapshot packages lives in this file.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cryo-runtime/cryo/configs"
	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

// App holds the global flags and the loaded configuration shared by every
// subcommand.
type App struct {
	ConfigPath string
	Output     string // "text" or "json"

	// Overrides of the configuration, set by flags.
	CacheDir         string
	CacheMaxMiB      int64
	S3               stores.S3Options
	s3UseSSL         string
	RegistryPlain    bool
	RegistryUser     string
	RegistryPassword string
	VerifyKey        string
	DecryptionKey    string
	RequireSignature bool
	Namespace        string

	Config configs.Config
	Stdout io.Writer
	Stderr io.Writer
}

// addGlobalFlags registers the flags every subcommand shares.
func (a *App) addGlobalFlags(fs *pflag.FlagSet) {
	fs.StringVar(&a.ConfigPath, "config", configs.DefaultPath, "node configuration file")
	fs.StringVarP(&a.Output, "output", "o", "text", "output format: text or json")
	fs.StringVar(&a.CacheDir, "cache-dir", "", "node blob cache directory (default: [snapshot] cache_dir + /blobs)")
	fs.Int64Var(&a.CacheMaxMiB, "cache-size", 0, "node blob cache limit in MiB (default: [snapshot] cache_size)")
	fs.StringVar(&a.S3.Endpoint, "s3-endpoint", "", "S3 endpoint host:port or URL (default: config, then STORAGE_S3_ENDPOINT)")
	fs.StringVar(&a.S3.AccessKeyID, "s3-access-key", "", "S3 access key id (default: config, then STORAGE_S3_ACCESS_KEY_ID)")
	fs.StringVar(&a.S3.SecretAccessKey, "s3-secret-key", "", "S3 secret key (prefer STORAGE_S3_SECRET_ACCESS_KEY: flags show in ps)")
	fs.StringVar(&a.S3.Region, "s3-region", "", "S3 region")
	fs.StringVar(&a.s3UseSSL, "s3-use-ssl", "", "S3 over TLS: true or false")
	fs.BoolVar(&a.RegistryPlain, "plain-http", false, "talk plain http to OCI registries")
	fs.StringVar(&a.RegistryUser, "registry-user", "", "OCI registry user name")
	fs.StringVar(&a.RegistryPassword, "registry-password", "", "OCI registry password (prefer the config file)")
	fs.StringVar(&a.VerifyKey, "verify-key", "", "Ed25519 public key file that signatures must verify with (default: [snapshot] verify_key)")
	fs.StringVar(&a.DecryptionKey, "decryption-key", "", "AES-256 key file of encrypted snapshots (default: [snapshot] encryption_key)")
	fs.BoolVar(&a.RequireSignature, "require-signature", false, "refuse snapshots without a valid signature (default: [snapshot] require_signature, on when verify_key is set)")
	fs.StringVar(&a.Namespace, "namespace", "", "namespace whose key in [snapshot] encryption_key_dir decrypts")
}

// load reads the configuration. A missing default file yields defaults.
func (a *App) load(cmd *cobra.Command) error {
	if a.Output != "text" && a.Output != "json" {
		return fmt.Errorf("--output %q: want text or json", a.Output)
	}
	path := a.ConfigPath
	if !cmd.Flags().Changed("config") {
		path = ""
	}
	cfg, err := configs.Load(path)
	if err != nil {
		return err
	}
	a.Config = cfg
	return nil
}

// storeOptions builds fetch options: flags over config over environment.
func (a *App) storeOptions() (stores.Options, error) {
	o := a.Config.Stores.FetchOptions()
	s3 := o.S3
	over := func(v *string, flag string) {
		if flag != "" {
			*v = flag
		}
	}
	over(&s3.Endpoint, a.S3.Endpoint)
	over(&s3.AccessKeyID, a.S3.AccessKeyID)
	over(&s3.SecretAccessKey, a.S3.SecretAccessKey)
	over(&s3.Region, a.S3.Region)
	if a.s3UseSSL != "" {
		b := a.s3UseSSL == "true" || a.s3UseSSL == "1"
		s3.UseSSL = &b
	}
	o.S3, o.MinIO = s3, s3
	o.Registry.PlainHTTP = a.RegistryPlain
	over(&o.Registry.Username, a.RegistryUser)
	over(&o.Registry.Password, a.RegistryPassword)
	return o, nil
}

func firstNonEmpty(v ...string) string {
	if i := slices.IndexFunc(v, func(s string) bool { return s != "" }); i >= 0 {
		return v[i]
	}
	return ""
}

// openStore opens a store URL; needRef says whether it must name a
// snapshot (tag or digest).
func (a *App) openStore(ctx context.Context, url string, needRef bool) (stores.Store, string, error) {
	o, err := a.storeOptions()
	if err != nil {
		return nil, "", err
	}
	s, ref, err := stores.Open(ctx, url, o)
	if err != nil {
		return nil, "", err
	}
	if needRef && ref == "" {
		return nil, "", fmt.Errorf("%s names no snapshot: add :tag or @sha256:<digest>", url)
	}
	return s, ref, nil
}

// node opens the node cache; --cache-dir and --cache-size override the
// blob cache's directory and limit.
func (a *App) node() (*nodecache.Node, error) {
	limit := a.CacheMaxMiB
	if limit == 0 {
		limit = a.Config.Snapshot.CacheMaxMiB
	}
	return nodecache.Open(a.Config.Snapshot.CacheDir, nodecache.Options{MaxBlobBytes: limit << 20, BlobDir: a.CacheDir})
}

// readOptions builds the snapshot reader policy: keys and requirements.
func (a *App) readOptions() (snapshot.ReadOptions, error) {
	sc := a.Config.Snapshot
	sc.VerifyKey = firstNonEmpty(a.VerifyKey, sc.VerifyKey)
	if a.DecryptionKey != "" {
		sc.EncryptionKey, sc.EncryptionKeyDir = a.DecryptionKey, ""
	}
	if a.RequireSignature {
		t := true
		sc.RequireSignature = &t
	}
	o, err := sc.ReadOptions(a.Namespace)
	if o.NodeKey != nil && a.Namespace == "" {
		// An operator holding the node key reads any namespace's
		// snapshots (--namespace still restricts to one).
		o.AnyTenant = true
	}
	if a.DecryptionKey != "" && o.NodeKey != nil {
		// --decryption-key may name a namespace's own key file: it also
		// decrypts directly.
		// decrypts directly, and so may a legacy node key.
		o.DecryptionKey, o.LegacyNodeKey = o.NodeKey, true
	}
	return o, err
}

// print writes v as JSON with --output json, else calls text.
func (a *App) print(v any, text func(w io.Writer)) error {
	if a.Output == "json" {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(a.Stdout)
	return nil
}

// isTerminal reports whether stdout is a terminal (for progress bars).
func (a *App) isTerminal() bool {
	f, ok := a.Stdout.(*os.File)
	if !ok || a.Output == "json" {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
