package sandbox

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/vmm"
)

// TestMemoryCapture: in the pause, a booted VM's RAM file is copied (the
// VM runs on) or linked (it ends: no copy), an eagerly restored VM's RAM
// is left to the device state; neither has a generation to publish. Each
// configures the VM in its own mode.
func TestMemoryCapture(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cryo-0123.ram")
	if err := os.WriteFile(path, []byte("guest pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	owned := &ownedMemory{path: path}
	for _, exit := range []bool{false, true} {
		c := &capture{record: &sandboxRecord{}}
		if err := owned.capture(c, exit); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(c.ram)
		if err != nil || !bytes.Equal(b, []byte("guest pages")) || c.gen != nil || c.record.RAMInStream {
			t.Errorf("exit %v: captured %q (%v), generation %v, in stream %v", exit, b, err, c.gen != nil, c.record.RAMInStream)
		}
		a, _ := os.Stat(path)
		l, _ := os.Stat(c.ram)
		if linked := os.SameFile(a, l); linked != exit {
			t.Errorf("exit %v: linked %v", exit, linked)
		}
		c.cleanup()
		if _, err := os.Stat(c.ram); !os.IsNotExist(err) {
			t.Errorf("exit %v: capture's file left: %v", exit, err)
		}
	}

	c := &capture{record: &sandboxRecord{}}
	if err := (&privateMemory{path: path}).capture(c, false); err != nil || c.ram != "" || c.gen != nil || !c.record.RAMInStream {
		t.Errorf("private capture: %v, file %q, generation %v, in stream %v; want the stream only", err, c.ram, c.gen != nil, c.record.RAMInStream)
	}

	for _, m := range []struct {
		mem  guestMemory
		want vmm.Memory
	}{{owned, vmm.Memory{Mode: vmm.MemoryOwned, Path: path}}, {&privateMemory{path: path}, vmm.Memory{Mode: vmm.MemoryPrivate, Path: path, Incoming: true}}} {
		var cfg vmm.Config
		m.mem.configure(&cfg)
		if cfg.Memory != m.want || m.mem.failure() != nil || m.mem.close(t.Context(), nil) != nil {
			t.Errorf("%T: configures %+v, want %+v", m.mem, cfg.Memory, m.want)
		}
	}
}

// waitGuest is a Guest whose Wait answers at once; the rest is unused.
type waitGuest struct{ Guest }

func (waitGuest) Wait(context.Context, string, string) (uint32, time.Time, error) {
	return 0, time.Now(), nil
}

// countingMemory counts what it is told of the sandbox's first request.
type countingMemory struct {
	guestMemory
	n int
}

func (m *countingMemory) interacted() { m.n++ }

// The end of an exec tells the guest memory that the sandbox answered a
// request (a lazily restored one then starts its prefetch); the end of a
// container's init does not.
func TestExecEndTellsTheMemory(t *testing.T) {
	mem := &countingMemory{}
	g := interactingGuest{Guest: waitGuest{}, mem: mem}
	if _, _, err := g.Wait(t.Context(), "c", ""); err != nil || mem.n != 0 {
		t.Fatalf("an init's end: err %v, memory told %d times, want 0", err, mem.n)
	}
	if _, _, err := g.Wait(t.Context(), "c", "e1"); err != nil || mem.n != 1 {
		t.Fatalf("an exec's end: err %v, memory told %d times, want 1", err, mem.n)
	}
}
