//go:build integration

package devstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/cryo-runtime/cryo/vmm/qmp"
)

const (
	itRAMSize = 64 << 20
	itBlock   = "ram0"
)

// TestSplitRealQEMU splits the stream of a real QEMU 7.2 whose RAM is a
// private mapping, and loads the split device state into a QEMU whose RAM
// is a shared file holding the extracted pages, as a shared clone's
// checkpoint and its restore will.
func TestSplitRealQEMU(t *testing.T) {
	ram := patternRAM()
	srcRAM := writeShm(t, "src", ram)
	src := startQEMU(t, "src", srcRAM, false, false)

	raw, out, image, st := saveSplit(t, src)
	t.Logf("stream %d bytes, split output %d bytes, %d pages of %s (%d fills)", st.In, st.Out, st.Pages, itBlock, st.FillPages)
	if st.In != int64(len(raw)) || st.Out != int64(len(out)) {
		t.Fatalf("stats In %d Out %d, read %d wrote %d", st.In, st.Out, len(raw), len(out))
	}
	if st.BlockSize != itRAMSize {
		t.Fatalf("block size %d, want %d", st.BlockSize, itRAMSize)
	}
	if !bytes.Equal(image, ram) {
		t.Fatalf("extracted pages differ from the RAM file at page %d", firstDiff(image, ram)/PageSize)
	}
	if st.FillPages == 0 || st.Pages-st.FillPages == 0 {
		t.Fatalf("want both pages and fills, got %d pages, %d fills", st.Pages, st.FillPages)
	}
	if len(out) > 2<<20 {
		t.Fatalf("split output %d bytes: want the device state without the guest RAM (< 2 MiB)", len(out))
	}

	t.Run("LoadSplitIntoSharedRAM", func(t *testing.T) {
		loadIntoShared(t, "dst", image, out)
	})
	t.Run("UnsplitRefusedBySharedRAM", func(t *testing.T) {
		// Why Split exists: the loader refuses a page of a block it ignores.
		dst := startQEMU(t, "dst-unsplit", writeShm(t, "dst-unsplit", image), true, true)
		err := dst.load(t, raw)
		if err == nil || !strings.Contains(err.Error(), "should not be migrated") {
			t.Fatalf("unsplit stream into a shared RAM: got %v, want QEMU's refusal of %s's pages", err, itBlock)
		}
	})
	t.Run("UnsplitIntoPrivateRAM", func(t *testing.T) {
		// Sanity: the stream Split read is one QEMU loads.
		dst := startQEMU(t, "dst-private", writeShm(t, "dst-private", make([]byte, itRAMSize)), false, true)
		if err := dst.load(t, raw); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("CorruptFooterRefused", func(t *testing.T) {
		// The START section's footer follows its EOS record; no page comes before it.
		i := bytes.Index(raw, []byte{0, 0, 0, 0, 0, 0, 0, flagEOS, footer})
		if i < 0 {
			t.Fatal("no end of ram's start section in the stream")
		}
		bad := bytes.Clone(raw)
		bad[i+8] ^= 0x01
		_, err := Split(bytes.NewReader(bad), &bytes.Buffer{}, itBlock, func(Page) error { return nil })
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "footer") {
			t.Fatalf("flipped footer: got %v, want a refused footer", err)
		}
	})
}

// TestSplitRanFirmware splits the stream of a VM that has run (its
// firmware, SeaBIOS, for two seconds: there is no guest kernel here) and
// was then stopped, as SaveState does; the destination then runs on.
func TestSplitRanFirmware(t *testing.T) {
	src := startQEMU(t, "fw-src", writeShm(t, "fw-src", patternRAM()), false, false)
	src.run(t, "cont", nil)
	time.Sleep(2 * time.Second)
	src.run(t, "stop", nil)
	// What the guest sees of its RAM; below 1 MiB, 0xa0000-0xfffff is VGA
	// and ROM, not ram0.
	mem := filepath.Join(t.TempDir(), "pmem")
	src.run(t, "pmemsave", map[string]any{"val": 0, "size": itRAMSize, "filename": mem})
	want, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}

	_, out, image, st := saveSplit(t, src)
	t.Logf("split output %d bytes, %d pages of %s (%d fills)", st.Out, st.Pages, itBlock, st.FillPages)
	copy(want[0xa0000:0x100000], image[0xa0000:0x100000])
	if !bytes.Equal(image, want) {
		t.Fatalf("extracted pages differ from the guest's memory at page %#x", firstDiff(image, want)/PageSize)
	}
	if bytes.Equal(image, patternRAM()) {
		t.Fatal("the firmware wrote nothing to RAM: the test shows nothing a stopped VM would not")
	}

	dst := loadIntoShared(t, "fw-dst", image, out)
	dst.run(t, "cont", nil)
	time.Sleep(500 * time.Millisecond)
	var status struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(dst.run(t, "query-status", nil), &status); err != nil {
		t.Fatal(err)
	}
	if status.Status != "running" {
		t.Fatalf("restored VM status %q, want running", status.Status)
	}
}

// patternRAM is random pages, zero pages and pages of one repeated byte.
func patternRAM() []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	ram := make([]byte, itRAMSize)
	for p := 0; p < itRAMSize/PageSize; p++ {
		page := ram[p*PageSize : (p+1)*PageSize]
		switch p % 4 {
		case 0:
			for i := range page {
				page[i] = byte(rng.Uint32())
			}
		case 2:
			for i := range page {
				page[i] = byte(p%255 + 1)
			}
		}
	}
	return ram
}

// loadIntoShared loads the split stream out into a new QEMU whose RAM is
// a shared file holding image, and checks that the load left the file as
// it was: the stream carried none of that RAM.
func loadIntoShared(t *testing.T, name string, image, out []byte) *qemu {
	t.Helper()
	ramPath := writeShm(t, name, image)
	dst := startQEMU(t, name, ramPath, true, true)
	if err := dst.load(t, out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(ramPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, image) {
		t.Fatalf("destination RAM file changed by the load at page %#x", firstDiff(got, image)/PageSize)
	}
	return dst
}

func writeShm(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := fmt.Sprintf("/dev/shm/cryo-devstate-test-%d-%s.ram", os.Getpid(), name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	return path
}

// qemu is one test QEMU and its monitor.
type qemu struct {
	mon    *qmp.Client
	exited chan struct{}
	stderr *lockedBuffer
}

// lockedBuffer is QEMU's stderr, read while QEMU may still write it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startQEMU starts a paused QEMU of itRAMSize whose RAM is ramPath, shared
// or private, waiting for an incoming migration if incoming; with
// x-ignore-shared and the bandwidth vmm sets.
func startQEMU(t *testing.T, name, ramPath string, share, incoming bool) *qemu {
	t.Helper()
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatalf("qemu-system-x86_64 not found (install qemu-system-x86, 7.2): %v", err)
	}
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	args := []string{
		"-machine", "pc-q35-7.2,accel=tcg,memory-backend=ram0", "-m", "64M",
		"-object", fmt.Sprintf("memory-backend-file,id=ram0,size=64M,mem-path=%s,share=%s", ramPath, onOff(share)),
		"-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-qmp", "unix:" + sock + ",server=on,wait=off",
	}
	if incoming {
		args = append(args, "-incoming", "defer")
	}
	cmd := exec.Command(bin, args...)
	q := &qemu{exited: make(chan struct{}), stderr: &lockedBuffer{}}
	cmd.Stderr = q.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(q.exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-q.exited
	})
	q.mon = dialQMP(t, sock, q)
	t.Cleanup(func() { q.mon.Close() })
	q.run(t, "migrate-set-capabilities", map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}})
	if !incoming {
		q.run(t, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40})
	}
	return q
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func dialQMP(t *testing.T, sock string, q *qemu) *qmp.Client {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		mon, err := qmp.Dial(ctx, sock)
		cancel()
		if err == nil {
			return mon
		}
		select {
		case <-q.exited:
			t.Fatalf("qemu exited: %s", q.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("qmp: %v (stderr: %s)", err, q.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (q *qemu) run(t *testing.T, cmd string, args any) json.RawMessage {
	t.Helper()
	ret, err := q.exec(cmd, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

func (q *qemu) exec(cmd string, args any, f *os.File) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if f != nil {
		return q.mon.ExecuteWithFile(ctx, cmd, args, f)
	}
	return q.mon.Execute(ctx, cmd, args)
}

// passFD hands f to QEMU as name (getfd, SCM_RIGHTS).
func (q *qemu) passFD(t *testing.T, f *os.File, name string) {
	t.Helper()
	if _, err := q.exec("getfd", map[string]any{"fdname": name}, f); err != nil {
		t.Fatal(err)
	}
}

// saveSplit migrates src into a pipe that Split reads; it returns the raw
// stream, the split output, the image the extracted pages make, and the
// stats.
func saveSplit(t *testing.T, src *qemu) (raw, out, image []byte, st Stats) {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	src.passFD(t, pw, "mig")
	pw.Close()
	image = make([]byte, itRAMSize)
	seen := make([]bool, itRAMSize/PageSize)
	var rawBuf, outBuf bytes.Buffer
	type result struct {
		st  Stats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := Split(teeReader{pr, &rawBuf}, &outBuf, itBlock, func(p Page) error {
			page := image[p.Off : p.Off+PageSize]
			if p.Data != nil {
				copy(page, p.Data)
			} else {
				for i := range page {
					page[i] = p.Fill
				}
			}
			seen[p.Off/PageSize] = true
			return nil
		})
		done <- result{st, err}
	}()
	src.run(t, "migrate", map[string]any{"uri": "fd:mig"})
	var res result
	select {
	case res = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("split did not end")
	}
	if res.err != nil {
		t.Fatalf("split: %v", res.err)
	}
	if err := src.waitMigration(); err != nil {
		t.Fatal(err)
	}
	for p, ok := range seen {
		if !ok {
			t.Fatalf("page %d of %s not in the stream", p, itBlock)
		}
	}
	return rawBuf.Bytes(), outBuf.Bytes(), image, res.st
}

type teeReader struct {
	r *os.File
	w *bytes.Buffer
}

func (t teeReader) Read(b []byte) (int, error) {
	n, err := t.r.Read(b)
	t.w.Write(b[:n])
	return n, err
}

// load runs an incoming migration of stream (from a file) and waits for it.
func (q *qemu) load(t *testing.T, stream []byte) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(path, stream, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q.passFD(t, f, "in")
	if _, err := q.exec("migrate-incoming", map[string]any{"uri": "fd:in"}, nil); err != nil {
		return err
	}
	if err := q.waitMigration(); err != nil {
		return err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(q.run(t, "query-status", nil), &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != "paused" && st.Status != "prelaunch" {
		return fmt.Errorf("after the migration: status %q", st.Status)
	}
	return nil
}

// waitMigration polls query-migrate until completed, failed or QEMU exited.
func (q *qemu) waitMigration() error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-q.exited:
			return fmt.Errorf("qemu exited during the migration: %s", q.stderr)
		default:
		}
		ret, err := q.exec("query-migrate", nil, nil)
		if err != nil {
			select {
			case <-q.exited:
				return fmt.Errorf("qemu exited during the migration: %s", q.stderr)
			case <-time.After(time.Second):
			}
			return fmt.Errorf("query-migrate: %w (stderr: %s)", err, q.stderr)
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(ret, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s (stderr: %s)", st.Status, st.ErrorDesc, q.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("migration not done after 2 minutes")
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
