package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	shimapi "github.com/cryo-runtime/cryo/shim/api/v1"
)

func newCheckpointCommand(a *App) *cobra.Command {
	var (
		to, ns, ttl  string
		leaveRunning bool
		timeout      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "checkpoint <container-or-sandbox-id>",
		Short: "Checkpoint a running sandbox into a store, through its shim",
		Long: "Asks the cryo shim that runs the container to capture its sandbox (RAM, device state, disks)\n" +
			"and publish it to --to (default: the cryo.dev/checkpoint-to annotation or [stores] default_checkpoint_to).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseTTL(ttl)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			client, closer, err := a.dialSandbox(ctx, ns, args[0])
			if err != nil {
				return err
			}
			defer closer()
			if a.Output == "text" {
				fmt.Fprintf(a.Stderr, "checkpointing %s/%s ...\n", ns, args[0])
			}
			r, err := client.Checkpoint(ctx, &shimapi.CheckpointRequest{Id: args[0], To: to, Exit: !leaveRunning, Ttl: durationpb.New(d)})
			if err != nil {
				return errgrpc.ToNative(err)
			}
			res := r.Report()
			return a.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "pause window %s, total %s; %s raw, %s stored, %s uploaded (%d of %d chunks, %d as deltas)\n",
					r.PauseWindow.AsDuration().Round(time.Millisecond), r.Duration.AsDuration().Round(time.Millisecond),
					humanize.IBytes(uint64(r.RawBytes)), humanize.IBytes(uint64(r.StoredBytes)), humanize.IBytes(uint64(r.UploadedBytes)),
					r.ChunksUploaded, r.Chunks, r.DeltaChunks)
				fmt.Fprintf(w, "checkpointed %s@%s\n", r.Ref, r.Digest)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "store URL with reference, e.g. file:///var/lib/cryo/store/agent:v1")
	f.StringVarP(&ns, "namespace", "n", "default", "containerd namespace of the container (k8s.io for Kubernetes pods)")
	f.BoolVar(&leaveRunning, "leave-running", true, "let the sandbox run on after the capture (false: stop it)")
	f.StringVar(&ttl, "ttl", "", "time to live recorded as the snapshot's expiry (e.g. 12h, 1d)")
	f.DurationVar(&timeout, "timeout", 30*time.Minute, "give up after this long")
	return cmd
}

// parseTTL reads a Go duration or a whole number of days ("1d").
func parseTTL(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("--ttl %q: want a duration such as 12h or 1d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("--ttl %q: want a duration such as 12h or 1d", s)
	}
	return d, nil
}

// dialSandbox finds the sandbox that runs namespace/id under the node's
// state root and connects to its shim's cryo API.
func (a *App) dialSandbox(ctx context.Context, ns, id string) (shimapi.SandboxService, func(), error) {
	dir, err := findSandbox(a.Config.Runtime.StateRoot, ns, id)
	if err != nil {
		return nil, nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(dir, shimapi.ExtensionSocket))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the shim of %s/%s: %w", ns, id, err)
	}
	c := ttrpc.NewClient(conn)
	return shimapi.NewSandboxClient(c), func() { c.Close() }, nil
}

func findSandbox(root, ns, id string) (string, error) {
	dirs, err := filepath.Glob(filepath.Join(root, "vm", "*"))
	if err != nil {
		return "", err
	}
	want := ns + "/" + id
	for _, dir := range dirs {
		f, err := os.Open(filepath.Join(dir, shimapi.ContainersFile))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if sc.Text() == want {
				f.Close()
				return dir, nil
			}
		}
		f.Close()
	}
	return "", fmt.Errorf("no cryo sandbox runs container %s under %s (check --namespace and --config): %w", want, root, errdefs.ErrNotFound)
}
