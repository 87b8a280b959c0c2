//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/typeurl/v2"

	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/stack"
)

// chatty prints about 80 KiB/s, so that a FIFO nobody reads fills up.
const chatty = `while true; do head -c 8192 /dev/zero | tr '\0' x; echo; sleep 0.1; done`

// readerMode is what containerd's side of the output FIFOs does: the
// client that created them (a detached ctr, a CRI that gave up) goes away
// before, during or after the shim opens them.
type readerMode int

const (
	neverOpened readerMode = iota // the reader never comes: the shim's open never completes
	goneBefore                    // opened and closed before the task is created
	goneDuring                    // closed while the shim creates the task
	goneAfter                     // closed after the task started
	fullPipe                      // opened and never read: the pipe fills
	readAll                       // a reader that keeps reading (the control)
	numModes
)

func (m readerMode) String() string {
	return [...]string{"never-opened", "gone-before", "gone-during", "gone-after", "full", "read-all"}[m]
}

// TestKillDeleteNeverHangs kills and deletes detached containers, booted
// and restored, whose stdio readers go away at varied moments, in a loop
// against the real containerd, shim and QEMU. Each iteration must see the
// exit event, a returning delete, and no QEMU or shim left.
// CRYO_HANG_ITERATIONS changes the count (default 50).
func TestKillDeleteNeverHangs(t *testing.T) {
	n := 50
	if v := os.Getenv("CRYO_HANG_ITERATIONS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("CRYO_HANG_ITERATIONS=%q: %v", v, err)
		}
	}
	e := harness.Start(t)
	store := e.StoreURL("hang") + ":v1"
	e.MustCtr(e.RunArgs("-d", harness.Image, "hang-src", "sh", "-c", chatty)...)
	checkpoint(t, e, "hang-src", store)
	e.MustCtr("task", "kill", "-s", "SIGKILL", "hang-src")
	waitStopped(t, e, "hang-src")
	e.MustCtr("task", "rm", "hang-src")
	e.MustCtr("c", "rm", "hang-src")
	noLeftovers(t, e)

	client, err := containerd.New(e.Socket, containerd.WithDefaultNamespace(e.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := t.Context()
	image, err := client.GetImage(ctx, harness.Image)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	var worstExit, worstDelete time.Duration
	for i := range n {
		it := hangIteration{
			id:       fmt.Sprintf("hang-%d", i),
			restored: i%2 == 1,
			mode:     readerMode((i / 2) % int(numModes)),
			delay:    time.Duration(rng.IntN(400)) * time.Millisecond,
		}
		if it.restored {
			it.restoreFrom = store
		}
		exit, del := it.run(t, e, client, image)
		worstExit, worstDelete = max(worstExit, exit), max(worstDelete, del)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d iterations: slowest exit event after SIGKILL %s, slowest task delete %s", n, worstExit, worstDelete)
}

type hangIteration struct {
	id          string
	restored    bool
	restoreFrom string
	mode        readerMode
	delay       time.Duration // when the reader goes (during/after) and when the kill comes
}

func (it hangIteration) String() string {
	kind := "booted"
	if it.restored {
		kind = "restored"
	}
	return fmt.Sprintf("%s (%s, reader %s, delay %s)", it.id, kind, it.mode, it.delay)
}

// run creates, starts, kills and deletes one container; it returns how long
// the exit event and the delete took.
func (it hangIteration) run(t *testing.T, e *harness.Env, client *containerd.Client, image containerd.Image) (time.Duration, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	fifos := newOutputFIFOs(t, it.mode)
	defer fifos.close()

	annotations := map[string]string{}
	if it.restored {
		annotations["cryo.dev/restore-from"] = it.restoreFrom
	}
	c, err := client.NewContainer(ctx, it.id,
		containerd.WithNewSnapshot(it.id, image),
		containerd.WithRuntime(harness.Runtime, &runtimeoptions.Options{ConfigPath: e.ConfigPath}),
		containerd.WithNewSpec(oci.WithImageConfig(image), oci.WithProcessArgs("sh", "-c", chatty), oci.WithAnnotations(annotations)))
	if err != nil {
		t.Fatalf("%s: new container: %v", it, err)
	}
	defer func() {
		if err := c.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup); err != nil {
			t.Errorf("%s: delete container: %v", it, err)
		}
	}()
	exits, errs := client.Subscribe(ctx, `topic=="/tasks/exit"`)

	if it.mode == goneDuring {
		go func() { time.Sleep(it.delay); fifos.close() }()
	}
	task, err := c.NewTask(ctx, fifos.creator())
	if err != nil {
		t.Fatalf("%s: create task: %v\n%s", it, err, e.LogTail(30))
	}
	statusC, err := task.Wait(ctx)
	if err != nil {
		t.Fatalf("%s: wait: %v", it, err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("%s: start: %v", it, err)
	}
	if it.mode == goneAfter {
		time.Sleep(it.delay)
		fifos.close()
	}
	time.Sleep(it.delay)

	killed := time.Now()
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatalf("%s: kill: %v", it, err)
	}
	exitWait := time.Since(killed)
	if !waitExitEvent(ctx, exits, errs, it.id, 30*time.Second) {
		t.Fatalf("%s: no /tasks/exit event within 30s of SIGKILL\n%s", it, e.LogTail(40))
	}
	exitWait = time.Since(killed)
	select {
	case st := <-statusC:
		if code := st.ExitCode(); code != 137 {
			t.Errorf("%s: exit status %d, want 137", it, code)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Wait did not return after the exit event", it)
	}
	// The shim publishes an exit once its output is drained, up to
	// drainMax (5 s) after it; the rest is slack for the other lanes' load.
	if exitWait > 15*time.Second {
		t.Errorf("%s: the exit event came %s after SIGKILL, want within the output's drain (5 s) and a little", it, exitWait)
	}

	deleted := time.Now()
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = task.Delete(dctx)
	dcancel()
	deleteWait := time.Since(deleted)
	if err != nil {
		t.Fatalf("%s: task delete did not return within 30s: %v\n%s", it, err, e.LogTail(40))
	}
	noLeftovers(t, e)
	return exitWait, deleteWait
}

// waitExitEvent waits for the TaskExit of container id's init process.
func waitExitEvent(ctx context.Context, events <-chan *events.Envelope, errs <-chan error, id string, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		select {
		case env := <-events:
			v, err := typeurl.UnmarshalAny(env.Event)
			if err != nil {
				continue
			}
			if ev, ok := v.(*eventstypes.TaskExit); ok && ev.ContainerID == id && ev.ID == id {
				return true
			}
		case <-errs:
			return false
		case <-deadline:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// outputFIFOs are a task's stdout and stderr FIFOs with containerd's side
// (the reader) played by the test.
type outputFIFOs struct {
	dir     string
	paths   [2]string
	readers [2]*os.File
}

func newOutputFIFOs(t *testing.T, mode readerMode) *outputFIFOs {
	t.Helper()
	f := &outputFIFOs{dir: t.TempDir()}
	for i, name := range []string{"stdout", "stderr"} {
		f.paths[i] = filepath.Join(f.dir, name)
		if err := syscall.Mkfifo(f.paths[i], 0o600); err != nil {
			t.Fatal(err)
		}
		if mode == neverOpened {
			continue
		}
		r, err := os.OpenFile(f.paths[i], os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.readers[i] = r
		if mode == readAll {
			go drainReader(r)
		}
	}
	if mode == goneBefore {
		f.close()
	}
	return f
}

// drainReader reads r until it is closed; with no writer yet (or any more),
// a non-blocking FIFO reads as EOF.
func drainReader(r *os.File) {
	buf := make([]byte, 64<<10)
	for {
		_, err := r.Read(buf)
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func (f *outputFIFOs) close() {
	for _, r := range f.readers {
		if r != nil {
			r.Close()
		}
	}
}

// creator hands the FIFOs to containerd as the task's IO.
func (f *outputFIFOs) creator() cio.Creator {
	return func(id string) (cio.IO, error) {
		return &fixedIO{cfg: cio.Config{Stdout: f.paths[0], Stderr: f.paths[1]}}, nil
	}
}

// fixedIO is a cio.IO whose copying the test does itself.
type fixedIO struct{ cfg cio.Config }

func (f *fixedIO) Config() cio.Config { return f.cfg }
func (f *fixedIO) Cancel()            {}
func (f *fixedIO) Wait()              {}
func (f *fixedIO) Close() error       { return nil }

// TestWatchdogReportsStuckCall arms the shims' watchdog below the time a
// cold boot takes: the Create must be reported as stuck, with the shim's
// goroutine dump, which is what the harness fails a test with.
func TestWatchdogReportsStuckCall(t *testing.T) {
	s, err := stack.Start(context.WithoutCancel(t.Context()), stack.Options{Watchdog: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	if _, err := s.CtrOK(s.RunArgs("--rm", harness.Image, "slow", "true")...); err != nil {
		t.Fatal(err)
	}
	stuck := s.StuckCalls()
	if len(stuck) == 0 {
		t.Fatalf("no stuck call reported for a Create that outran a 300ms watchdog\n%s", s.LogTail(30))
	}
	if r := stuck[0]; !strings.Contains(r, "Task/Create") || !strings.Contains(r, "goroutine stack dump") || !strings.Contains(r, "shim.(*service).Create") {
		t.Fatalf("stuck call report lacks the method or the dump:\n%.3000s", r)
	}
}

// TestKillPausedTask: `ctr task rm -f` of a paused task (SIGKILL, then
// delete) finishes at once: SIGKILL resumes the VM, as runc thaws a frozen
// container it kills, while another signal is refused instead of waiting
// for an agent that cannot answer.
func TestKillPausedTask(t *testing.T) {
	e := harness.Start(t)
	const id = "paused"
	e.MustCtr(e.RunArgs("-d", harness.Image, id, "sleep", "1000")...)
	e.MustCtr("task", "pause", id)
	start := time.Now()
	if _, _, err := e.Ctr("task", "kill", "-s", "SIGTERM", id); err == nil {
		t.Fatal("SIGTERM to a paused task succeeded: it cannot reach the guest")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("SIGTERM to a paused task took %s to be refused", d)
	}
	start = time.Now()
	e.MustCtr("task", "rm", "-f", id)
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("task rm -f of a paused task took %s", d)
	}
	e.MustCtr("c", "rm", id)
	noLeftovers(t, e)
}
