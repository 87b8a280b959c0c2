//go:build integration

package vmm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/vmm/devstate"
)

// TestSaveStateLiveIsThePause: a live save of a guest that writes all the
// time carries, as each page's last copy, exactly the RAM the paused VM
// holds afterwards. Under TCG, QEMU 7.2's dirty tracking loses writes made
// after a pass (stopsFirst), and a stream taken while the guest ran would
// differ from it in some pages: in about one first save of three here, so
// three guests are saved, twice each (the first save, and one after a
// resume, as a clone's checkpoints go).
func TestSaveStateLiveIsThePause(t *testing.T) {
	for try := 1; try <= 3; try++ {
		vm := restoredPrivate(t, "live"+strconv.Itoa(try))
		startWriters(t, dialAgent(t, vm))
		for save := 1; save <= 2; save++ {
			time.Sleep(2 * time.Second)
			if n, first := lostPages(t, vm); n > 0 {
				t.Fatalf("guest %d, save %d: %d pages of the stream are not the paused guest's (first: %v): the save lost writes made while it ran", try, save, n, first)
			}
			if err := vm.Resume(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if err := vm.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// startWriters starts shells that rewrite a 64 KiB and a 16 MiB file in RAM
// from two patterns in turn, as fast as they can: the kernel writes the
// files' pages through its own (global) mappings, which stay in the vCPU's
// TLB.
func startWriters(t *testing.T, a *agentConn) {
	t.Helper()
	writer := `(head -c %[1]d /dev/urandom > /tmp/%[2]s0; head -c %[1]d /dev/urandom > /tmp/%[2]s1; cp /tmp/%[2]s0 /tmp/%[2]s; ` +
		`while :; do dd if=/tmp/%[2]s1 of=/tmp/%[2]s bs=64k conv=notrunc; dd if=/tmp/%[2]s0 of=/tmp/%[2]s bs=64k conv=notrunc; done) >/dev/null 2>&1 & echo started`
	for _, w := range []struct {
		size int
		name string
	}{{64 << 10, "small"}, {16 << 20, "large"}} {
		if got := a.run(t, fmt.Sprintf(writer, w.size, w.name)); got != "started" {
			t.Fatalf("writer %s: %q", w.name, got)
		}
	}
}

// lostPages saves vm live and compares the stream's last copy of each page
// with its guest RAM once paused: how many differ, and the first few.
func lostPages(t *testing.T, vm *Machine) (int, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := os.Create(filepath.Join(t.TempDir(), "stream"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := vm.SaveStateLive(ctx, f, LiveSave{Converge: 2 * time.Second, Stopped: func(context.Context, time.Time) error { return nil }}); err != nil {
		t.Fatalf("SaveStateLive: %v", err)
	}
	// finish-migrate until QEMU has ended the migration's run state.
	if s, _ := vm.Status(ctx); s != "postmigrate" && s != "finish-migrate" {
		t.Fatalf("status after the save = %q, want postmigrate (paused)", s)
	}
	paused := guestRAM(t, vm)
	stream := streamRAM(t, f, int64(len(paused)))
	var differ []string
	for off := 0; off < len(paused); off += devstate.PageSize {
		if !bytes.Equal(paused[off:off+devstate.PageSize], stream[off:off+devstate.PageSize]) {
			differ = append(differ, fmt.Sprintf("%#x", off))
		}
	}
	return len(differ), differ[:min(len(differ), 8)]
}

// restoredPrivate is a machine restored from a booted one's saved RAM,
// mapped privately (the only mode whose RAM a save streams), running.
func restoredPrivate(t *testing.T, id string) *Machine {
	t.Helper()
	cfg := testConfig(t, id)
	src := startVM(t, cfg)
	waitConsole(t, src, "cryo-test-ready", 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	state := filepath.Join(t.TempDir(), "devstate")
	w, err := os.OpenFile(state, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := src.SaveState(ctx, w); err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	ram := keepRAM(t, src)
	dcfg := cfg
	dcfg.StateDir = t.TempDir()
	dcfg.Memory = Memory{Mode: MemoryPrivate, Path: ram, Incoming: true}
	dst := startVM(t, dcfg)
	r, err := os.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := dst.LoadState(ctx, r); err != nil {
		t.Fatalf("LoadState: %v", err)
	}
	if err := dst.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	return dst
}

// guestRAM reads m's guest RAM from its QEMU's mapping of it.
func guestRAM(t *testing.T, m *Machine) []byte {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", m.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	size := int64(m.Config().MemoryMiB) << 20
	name := filepath.Base(m.ramFile())
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.Contains(line, name) {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || int64(end-start) != size {
			continue
		}
		mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", m.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		b := make([]byte, size)
		if _, err := mem.ReadAt(b, int64(start)); err != nil {
			t.Fatalf("read qemu's guest ram: %v", err)
		}
		return b
	}
	t.Fatalf("no %d-byte mapping of %s in qemu's maps:\n%s", size, name, maps)
	return nil
}

// streamRAM is the RAM a save's stream carries: each page's last copy.
func streamRAM(t *testing.T, f *os.File, size int64) []byte {
	t.Helper()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	_, err := devstate.Split(bufio.NewReader(f), io.Discard, "ram0", func(p devstate.Page) error {
		if p.Off+devstate.PageSize > size {
			return fmt.Errorf("page at %#x outside the ram", p.Off)
		}
		if p.Data != nil {
			copy(b[p.Off:], p.Data)
		} else {
			for i := range b[p.Off : p.Off+devstate.PageSize] {
				b[p.Off+int64(i)] = p.Fill
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
