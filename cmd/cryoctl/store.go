package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/dustin/go-humanize"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/cryo-runtime/cryo/nodecache"
	"github.com/cryo-runtime/cryo/snapshot"
	"github.com/cryo-runtime/cryo/stores"
)

type lsEntry struct {
	Tag         string        `json:"tag"`
	Digest      digest.Digest `json:"digest"`
	Created     *time.Time    `json:"created,omitempty"`
	Expires     *time.Time    `json:"expires,omitempty"`
	StoredBytes int64         `json:"storedBytes,omitempty"`
	Error       string        `json:"error,omitempty"`
}

func newLsCommand(a *App) *cobra.Command {
	var long, all bool
	cmd := &cobra.Command{
		Use:   "ls <store-url>",
		Short: "List the snapshots (tags) in a store",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			store, _, err := a.openStore(ctx, args[0], false)
			if err != nil {
				return err
			}
			tags, err := store.Tags(ctx)
			if err != nil {
				return err
			}
			entries := []lsEntry{}
			for _, t := range tags {
				if snapshot.IsSignatureTag(t) && !all {
					continue
				}
				e := lsEntry{Tag: t}
				d, err := store.Resolve(ctx, t)
				if err != nil {
					e.Error = err.Error()
				}
				e.Digest = d.Digest
				if long && err == nil && !snapshot.IsSignatureTag(t) {
					if s, err := snapshot.Open(ctx, store, d.Digest.String(), snapshot.ReadOptions{}); err != nil {
						e.Error = err.Error()
					} else {
						md := s.Metadata
						e.Created, e.StoredBytes = &md.Created, md.Totals.StoredBytes
						if !md.Expires.IsZero() {
							e.Expires = &md.Expires
						}
					}
				}
				entries = append(entries, e)
			}
			return a.print(entries, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				defer tw.Flush()
				for _, e := range entries {
					fmt.Fprintf(tw, "%s\t%s", e.Tag, e.Digest)
					if long {
						created, expires := "-", "never"
						if e.Created != nil {
							created = e.Created.Format(time.RFC3339)
						}
						if e.Expires != nil {
							expires = e.Expires.Format(time.RFC3339)
						}
						fmt.Fprintf(tw, "\t%s\t%s\t%s", created, expires, humanize.IBytes(uint64(e.StoredBytes)))
					}
					if e.Error != "" {
						fmt.Fprintf(tw, "\terror: %s", e.Error)
					}
					fmt.Fprintln(tw)
				}
			})
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "open each snapshot: created, expires, stored size")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "also list signature tags")
	return cmd
}

func newRmCommand(a *App) *cobra.Command {
	return &cobra.Command{
		Use:   "rm <store-url:tag>",
		Short: "Remove a snapshot's tag (and its signature when no other tag needs it); blobs go at gc",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			store, ref, err := a.openStore(ctx, args[0], true)
			if err != nil {
				return err
			}
			d, err := removeSnapshot(ctx, store, ref)
			if err != nil {
				return err
			}
			return a.print(map[string]any{"removed": args[0], "digest": d}, func(w io.Writer) {
				fmt.Fprintf(w, "removed %s (%s)\n", args[0], d)
			})
		},
	}
}

// removeSnapshot untags tag and, unless another tag names the same
// manifest, its signature.
func removeSnapshot(ctx context.Context, store stores.Store, tag string) (digest.Digest, error) {
	desc, err := store.Resolve(ctx, tag)
	if err != nil {
		return "", err
	}
	if err := store.Untag(ctx, tag); err != nil {
		return "", err
	}
	tags, err := store.Tags(ctx)
	if err != nil {
		return desc.Digest, err
	}
	for _, t := range tags {
		if snapshot.IsSignatureTag(t) {
			continue
		}
		if d, err := store.Resolve(ctx, t); err == nil && d.Digest == desc.Digest {
			return desc.Digest, nil // still named: keep the signature
		}
	}
	if err := store.Untag(ctx, snapshot.SignatureTag(desc.Digest)); err != nil && !errdefs.IsNotFound(err) {
		return desc.Digest, fmt.Errorf("remove signature of %s: %w", desc.Digest, err)
	}
	return desc.Digest, nil
}

type gcStoreResult struct {
	Store   string          `json:"store"`
	Expired []string        `json:"expired"`
	Blobs   stores.GCResult `json:"blobs"`
	Skipped []string        `json:"skipped,omitempty"` // tags that could not be read
}

type gcResult struct {
	Stores     []gcStoreResult     `json:"stores"`
	CacheFreed int64               `json:"cacheFreedBytes"`
	Cache      nodecache.BlobStats `json:"cache"`
	// Materialized is what went from <cache_dir>/snapshots.
	Materialized *nodecache.PruneStats `json:"materialized,omitempty"`
	// Bases is what went from <cache_dir>/bases: shared clones' holder
	// records of shims that are gone.
	Bases *nodecache.BasePruneStats `json:"bases,omitempty"`
}

func newGCCommand(a *App) *cobra.Command {
	var dryRun, noCache bool
	var grace, keepMaterialized time.Duration
	cmd := &cobra.Command{
		Use:   "gc [store-url...]",
		Short: "Remove expired snapshots and unreferenced blobs from stores, trim the node cache to its limit, and remove unused materialized snapshots",
		Long: `gc removes expired snapshots and unreferenced blobs from the stores named, trims
the node's blob cache to its limit, and removes the node's materialized snapshots
(<cache_dir>/snapshots) that no running sandbox uses and none was restored from within
--keep-materialized. A restore materializes its snapshot again from the blob cache or
the store. --no-cache leaves the node alone.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			res := gcResult{Stores: []gcStoreResult{}}
			for _, url := range args {
				r, err := a.gcStore(ctx, url, dryRun, grace)
				if err != nil {
					return err
				}
				res.Stores = append(res.Stores, r)
			}
			if !noCache {
				node, err := a.node()
				if err != nil {
					return err
				}
				p, err := node.Prune(ctx, nodecache.PruneOptions{KeepMaterialized: keepMaterialized, DryRun: dryRun})
				if err != nil {
					return err
				}
				res.CacheFreed, res.Cache, res.Materialized, res.Bases = p.BlobsFreed, p.Blobs, &p.Materialized, &p.Bases
			}
			return a.print(res, func(w io.Writer) {
				for _, r := range res.Stores {
					fmt.Fprintf(w, "%s: %d expired snapshots removed, %d blobs (%s) deleted, %d reachable, %d young kept\n",
						r.Store, len(r.Expired), r.Blobs.Deleted, humanize.IBytes(uint64(r.Blobs.DeletedBytes)), r.Blobs.Reachable, r.Blobs.Kept)
					for _, s := range r.Skipped {
						fmt.Fprintf(w, "  skipped %s\n", s)
					}
				}
				if !noCache {
					fmt.Fprintf(w, "cache: %s freed, %s in %d blobs (limit %s)\n", humanize.IBytes(uint64(res.CacheFreed)),
						humanize.IBytes(uint64(res.Cache.Bytes)), res.Cache.Blobs, humanize.IBytes(uint64(res.Cache.MaxBytes)))
					m := res.Materialized
					fmt.Fprintf(w, "materialized: %d removed (%s freed), %d in use, %d used within %s\n",
						len(m.Removed), humanize.IBytes(uint64(m.FreedBytes)), m.InUse, m.Recent, keepMaterialized)
					fmt.Fprintf(w, "shared ram bases: %d holders live, %d records of gone ones removed\n", res.Bases.Live, res.Bases.Removed)
				}
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "report without deleting")
	cmd.Flags().BoolVar(&noCache, "no-cache", false, "leave the node cache and its materialized snapshots alone")
	cmd.Flags().DurationVar(&keepMaterialized, "keep-materialized", 24*time.Hour, "keep unused materialized snapshots that a restore used within this long")
	cmd.Flags().DurationVar(&grace, "grace", time.Hour, "keep unreferenced blobs younger than this (a publish may be in progress)")
	return cmd
}

func (a *App) gcStore(ctx context.Context, url string, dryRun bool, grace time.Duration) (gcStoreResult, error) {
	r := gcStoreResult{Store: url, Expired: []string{}}
	store, _, err := a.openStore(ctx, url, false)
	if err != nil {
		return r, err
	}
	tags, err := store.Tags(ctx)
	if err != nil {
		return r, err
	}
	for _, t := range tags {
		if snapshot.IsSignatureTag(t) {
			continue
		}
		s, err := snapshot.Open(ctx, store, t, snapshot.ReadOptions{})
		if err != nil {
			r.Skipped = append(r.Skipped, t+": "+err.Error())
			continue
		}
		if !expired(s.Metadata) {
			continue
		}
		r.Expired = append(r.Expired, t)
		if !dryRun {
			if _, err := removeSnapshot(ctx, store, t); err != nil {
				return r, fmt.Errorf("gc %s: remove expired %s: %w", url, t, err)
			}
		}
	}
	if grace == 0 {
		grace = -1 // stores.GC treats 0 as its default
	}
	// A running lazy sandbox of this node keeps reading its snapshot's
	// blobs, expired or untagged.
	var keep []digest.Digest
	if node, err := a.node(); err == nil {
		if keep, err = node.Snapshots().Leased(); err != nil {
			return r, fmt.Errorf("gc %s: leases of running lazy sandboxes: %w", url, err)
		}
	}
	r.Blobs, err = stores.GC(ctx, store, stores.GCOptions{Grace: grace, DryRun: dryRun, Keep: keep})
	if errdefs.IsNotImplemented(err) {
		r.Skipped = append(r.Skipped, "blobs: the store collects its own garbage")
		err = nil
	}
	return r, err
}

type pullResult struct {
	Ref        string              `json:"ref"`
	Manifest   digest.Digest       `json:"manifest"`
	Blobs      int                 `json:"blobs"`
	Bytes      int64               `json:"bytes"`
	Downloaded int64               `json:"downloadedBytes"`
	Cache      nodecache.BlobStats `json:"cache"`
}

func newPullCommand(a *App) *cobra.Command {
	return &cobra.Command{
		Use:   "pull <store-url:tag|@digest>",
		Short: "Download a snapshot into the node cache (verified), so a restore finds it local",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			store, ref, err := a.openStore(ctx, args[0], true)
			if err != nil {
				return err
			}
			node, err := a.node()
			if err != nil {
				return err
			}
			c, err := node.Blobs()
			if err != nil {
				return err
			}
			res, err := a.pull(ctx, store, c, ref, args[0])
			if err != nil {
				return fmt.Errorf("pull %s: %w", args[0], err)
			}
			res.Ref = args[0]
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "pulled %s (%s): %d blobs, %s, %s downloaded\n", res.Ref, res.Manifest, res.Blobs,
					humanize.IBytes(uint64(res.Bytes)), humanize.IBytes(uint64(res.Downloaded)))
			})
		},
	}
}

// pull fetches every blob of the snapshot (and its signature) into c.
func (a *App) pull(ctx context.Context, store stores.Store, c *nodecache.Blobs, ref, storeURL string) (pullResult, error) {
	var res pullResult
	var bar *progress
	copts := a.Config.Stores.CachingOptions(storeURL)
	copts.Progress = func(_ ocispec.Descriptor, n int64) { bar.Add(n) }
	cs := nodecache.NewCachingStore(store, c, copts)
	o, err := a.readOptions()
	if err != nil {
		return res, err
	}
	before := c.Stats().BytesDownloaded
	// Open checks the signature policy and validates the manifest and
	// config (which land in the cache on the way).
	s, err := snapshot.Open(ctx, cs, ref, o)
	if err != nil {
		return res, err
	}
	res.Manifest = s.Descriptor.Digest
	var blobs []ocispec.Descriptor
	seen := map[digest.Digest]bool{}
	collect := func(d ocispec.Descriptor) error {
		if !seen[d.Digest] {
			seen[d.Digest] = true
			blobs = append(blobs, d)
		}
		return nil
	}
	if err := stores.Walk(ctx, cs, s.Descriptor, collect); err != nil {
		return res, err
	}
	if sd, err := store.Resolve(ctx, snapshot.SignatureTag(s.Descriptor.Digest)); err == nil {
		if err := stores.Walk(ctx, cs, sd, collect); err != nil {
			return res, err
		}
	} else if !errdefs.IsNotFound(err) {
		return res, err
	}
	var missing int64
	for _, b := range blobs {
		res.Blobs++
		res.Bytes += b.Size
		if !c.Has(b.Digest) {
			missing += b.Size
		}
	}
	bar = a.newProgress(missing, "pull")
	defer bar.Done()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(a.Config.Stores.MaxConcurrentFetches, 1))
	for _, b := range blobs {
		unpin := c.Pin(b.Digest)
		defer unpin()
		g.Go(func() error { return cs.Ensure(gctx, b) })
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	res.Cache = c.Stats()
	res.Downloaded = res.Cache.BytesDownloaded - before
	return res, nil
}
