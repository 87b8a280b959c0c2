package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/opencontainers/go-digest"
	"github.com/spf13/cobra"

	"github.com/cryo-runtime/cryo/snapshot"
)

// snapshotInfo is what inspect prints.
type snapshotInfo struct {
	Ref       string            `json:"ref"`
	Manifest  digest.Digest     `json:"manifest"`
	Signed    bool              `json:"signed"`
	Encrypted bool              `json:"encrypted"`
	Expired   bool              `json:"expired"`
	Chunks    int               `json:"chunks"`
	Metadata  snapshot.Metadata `json:"metadata"`
}

func newInspectCommand(a *App) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect <store-url:tag|@digest>",
		Short: "Show a snapshot's metadata, sizes, chunk counts and VM fingerprint",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// inspect shows what a snapshot is, also one this node would
			// refuse; it says so instead of failing (verify enforces).
			s, err := a.openSnapshot(cmd, args[0], true)
			if err != nil {
				return err
			}
			info := snapshotInfo{
				Ref: args[0], Manifest: s.Descriptor.Digest, Signed: s.Signed, Encrypted: s.Encrypted(),
				Expired: expired(s.Metadata), Chunks: s.Chunks(), Metadata: s.Metadata,
			}
			sig, enc := a.signatureStatus(s.Signed), a.encryptionStatus(s.Metadata.Encryption)
			return a.print(info, func(w io.Writer) { printInfo(w, info, sig, enc) })
		},
	}
}

// openSnapshot opens a snapshot with the node's policy; lenient drops the
// requirements (not the checks: a bad signature is still refused).
func (a *App) openSnapshot(cmd *cobra.Command, url string, lenient bool) (*snapshot.Snapshot, error) {
	store, ref, err := a.openStore(cmd.Context(), url, true)
	if err != nil {
		return nil, err
	}
	o, err := a.readOptions()
	if err != nil {
		return nil, err
	}
	if lenient {
		o.RequireSignature, o.RequireEncryption = false, false
	}
	return snapshot.Open(cmd.Context(), store, ref, o)
}

// signatureStatus says in words what the signature check found.
func (a *App) signatureStatus(signed bool) string {
	o, _ := a.readOptions()
	switch {
	case signed:
		return "yes, signature valid"
	case o.PublicKey == nil:
		return "NOT VERIFIED: no verify key configured ([snapshot] verify_key or --verify-key); anyone who can write to the store could have made or changed it"
	case o.RequireSignature:
		return "NO, UNSIGNED: this node requires signatures and refuses to restore it"
	}
	return "NO, UNSIGNED: anyone who can write to the store could have made or changed it"
}

// encryptionStatus says in words whether the snapshot is encrypted.
func (a *App) encryptionStatus(e *snapshot.Encryption) string {
	if e != nil {
		return "yes, " + e.Algorithm + ", key " + e.KeyID
	}
	if o, _ := a.readOptions(); o.RequireEncryption {
		return "NO, PLAINTEXT: guest RAM and disks are readable in the store; this node requires encryption and refuses to restore it"
	}
	return "NO, PLAINTEXT: guest RAM and disks are readable by anyone who can read the store"
}

func expired(md snapshot.Metadata) bool {
	return !md.Expires.IsZero() && md.Expires.Before(time.Now())
}

func printInfo(w io.Writer, i snapshotInfo, sig, enc string) {
	md := i.Metadata
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	row := func(k, format string, v ...any) { fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, v...)...) }
	row("Reference", "%s", i.Ref)
	row("Manifest", "%s", i.Manifest)
	row("Format", "v%d, %s, %s chunks", md.FormatVersion, md.Compression, humanize.IBytes(uint64(md.ChunkSize)))
	row("Created", "%s", md.Created.Format(time.RFC3339))
	exp := "never"
	if !md.Expires.IsZero() {
		exp = md.Expires.Format(time.RFC3339)
		if i.Expired {
			exp += " (expired)"
		}
	}
	row("Expires", "%s", exp)
	src := md.Source
	row("Source", "sandbox %s, pod %s/%s, node %s", orDash(src.SandboxID), orDash(src.Namespace), orDash(src.PodName), orDash(src.Node))
	row("Signed", "%s", sig)
	row("Encrypted", "%s", enc)
	fp := md.Fingerprint
	row("VM", "QEMU %s, %s, cpu %s, %d vCPU, %d MiB, accel %s", orDash(fp.QEMUVersion), orDash(fp.MachineType), orDash(fp.CPUModel), fp.VCPUs, fp.MemoryMiB, orDash(fp.Accel))
	if len(fp.HostCPUFlags) > 0 {
		row("CPU flags", "%s", strings.Join(fp.HostCPUFlags, " "))
	}
	for _, d := range fp.Devices {
		row("Device", "%s %s %s", d.ID, d.Driver, d.PCIAddr)
	}
	if fp.KernelDigest != "" || fp.InitrdDigest != "" {
		row("Guest", "kernel %s, initrd %s", orDash(fp.KernelDigest), orDash(fp.InitrdDigest))
	}
	for _, f := range md.Files {
		row("File", "%-12s %10s  %d chunks", f.Name, humanize.IBytes(uint64(f.Size)), f.Chunks)
	}
	t := md.Totals
	ratio := 0.0
	if t.DataBytes > 0 {
		ratio = float64(t.StoredBytes) / float64(t.DataBytes)
	}
	row("Totals", "%s raw, %s data, %s stored (%.2f of data), %d chunks", humanize.IBytes(uint64(t.RawBytes)),
		humanize.IBytes(uint64(t.DataBytes)), humanize.IBytes(uint64(t.StoredBytes)), ratio, t.Chunks)
	if t.Deltas > 0 {
		row("Deltas", "%d of the chunks are page deltas against %d base chunks (counted in stored)", t.Deltas, t.Bases)
	}
	for _, c := range md.Containers {
		row("Container", "%s %s (%d layers)", c.ID, orDash(c.Image), len(c.LayerChain))
	}
	if n := md.Network; n.Hostname != "" || len(n.Interfaces) > 0 {
		row("Network", "hostname %s, %d interfaces", orDash(n.Hostname), len(n.Interfaces))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// verifyResult is what verify prints.
type verifyResult struct {
	Ref         string        `json:"ref"`
	Manifest    digest.Digest `json:"manifest"`
	Signed      bool          `json:"signed"`
	Encrypted   bool          `json:"encrypted"`
	Chunks      int           `json:"chunks"`
	StoredBytes int64         `json:"storedBytes"`
	RawBytes    int64         `json:"rawBytes"`
	OK          bool          `json:"ok"`
}

func newVerifyCommand(a *App) *cobra.Command {
	return &cobra.Command{
		Use:   "verify <store-url:tag|@digest>",
		Short: "Check every digest, the signature and every chunk's decryption and size",
		Long: "verify fetches the whole snapshot and checks the manifest and config digests, the\n" +
			"signature (required with --require-signature or [snapshot] require_signature),\n" +
			"and every chunk: digest, decryption, decompressed size. Nothing is written.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.openSnapshot(cmd, args[0], false)
			if err != nil {
				return err
			}
			st, err := s.Verify(cmd.Context())
			if err != nil {
				return fmt.Errorf("verify %s: %w", args[0], err)
			}
			res := verifyResult{Ref: args[0], Manifest: s.Descriptor.Digest, Signed: s.Signed, Encrypted: s.Encrypted(),
				Chunks: st.Chunks, StoredBytes: st.StoredBytes, RawBytes: st.RawBytes, OK: true}
			sig, enc := a.signatureStatus(s.Signed), a.encryptionStatus(s.Metadata.Encryption)
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "OK %s %s: %d chunks, %s stored, %s raw\n", args[0], res.Manifest, res.Chunks,
					humanize.IBytes(uint64(res.StoredBytes)), humanize.IBytes(uint64(res.RawBytes)))
				fmt.Fprintf(w, "Signed: %s\nEncrypted: %s\n", sig, enc)
			})
		},
	}
}
