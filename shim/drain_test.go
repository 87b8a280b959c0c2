package shim

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// execWithFIFO adds exec id to the pod with its stdout on a FIFO, as
// containerd's CRI and ctr give it, and reads that FIFO as containerd
// does: what it read comes on the channel once the shim closed its end.
func (ts *testService) execWithFIFO(t *testing.T, id string) <-chan string {
	t.Helper()
	fifo := filepath.Join(ts.dir, id+".stdout")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	read := make(chan string, 1)
	go func() {
		f, err := os.Open(fifo) // waits for the shim's end
		if err != nil {
			read <- "open: " + err.Error()
			return
		}
		defer f.Close()
		b, _ := io.ReadAll(f)
		read <- string(b)
	}()
	spec, err := typeurl.MarshalAnyToProto(&specs.Process{Args: []string{"sh", "-c", "echo out; sleep 365d &"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Exec(ts.ctx, &taskAPI.ExecProcessRequest{ID: "pod", ExecID: id, Spec: spec, Stdout: fifo}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Start(ts.ctx, &taskAPI.StartRequest{ID: "pod", ExecID: id}); err != nil {
		t.Fatal(err)
	}
	return read
}

// TestExecOutputOutlivesExit: as runc's shim, an exec's exit is published
// at once while a background child still holds its output (the guest
// sends no EOF), and containerd's side of the stream stays open: it
// closes at the guest's EOF (the last writer closed), with every byte,
// or at the exec's Delete. CRI's ExecSync relies on this to tell a drained
// exec from one whose output is still held (drain_exec_sync_io_timeout).
func TestExecOutputOutlivesExit(t *testing.T) {
	ts := newTestService(t)
	ts.startPod(t)
	g := ts.maker.sb.guest
	for _, end := range []string{"guest eof", "delete"} {
		t.Run(end, func(t *testing.T) {
			id := map[string]string{"guest eof": "e1", "delete": "e2"}[end]
			out := g.output("pod", id)
			read := ts.execWithFIFO(t, id)
			out <- []byte("out\n")
			start := time.Now()
			g.exit("pod", id) <- 0
			ts.waitExec(t, id)
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("exit took %s with the output held: it must not wait for the output's end", d)
			}
			select {
			case got := <-read:
				t.Fatalf("stdout closed while the guest still writes to it, after %q", got)
			case <-time.After(drainIdle + 300*time.Millisecond):
			}
			if end == "guest eof" {
				out <- []byte("late\n")
				close(out)
			} else if _, err := ts.Delete(ts.ctx, &taskAPI.DeleteRequest{ID: "pod", ExecID: id}); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"guest eof": "out\nlate\n", "delete": "out\n"}[end]
			select {
			case got := <-read:
				if got != want {
					t.Fatalf("stdout %q, want %q", got, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("stdout still open 5s after the %s", end)
			}
		})
	}
}

// TestExecOutputClosesAtGuestEOF: an exec whose output ends with it (no
// background child: the guest's EOF comes right away) has its stream
// closed without a Delete, as `ctr task exec` and crictl exec wait for.
func TestExecOutputClosesAtGuestEOF(t *testing.T) {
	ts := newTestService(t)
	ts.startPod(t)
	g := ts.maker.sb.guest
	out := g.output("pod", "e1")
	read := ts.execWithFIFO(t, "e1")
	out <- []byte("hello\n")
	close(out)
	g.exit("pod", "e1") <- 0
	ctx, cancel := context.WithTimeout(ts.ctx, 5*time.Second)
	defer cancel()
	select {
	case got := <-read:
		if got != "hello\n" {
			t.Fatalf("stdout %q, want %q", got, "hello\n")
		}
	case <-ctx.Done():
		t.Fatal("stdout of an exec whose output ended is still open after 5s")
	}
}
