package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cryo-runtime/cryo/fingerprint"
	"github.com/cryo-runtime/cryo/vmm"
)

// streamVM is a VM whose SaveState writes stream, then fails with err.
type streamVM struct {
	stream string
	err    error
}

func (v streamVM) SaveState(context.Context, *os.File) error {
	panic("a split RAM's device state is saved live")
}

// SaveStateLive writes half the stream, stops, writes the rest.
func (v streamVM) SaveStateLive(ctx context.Context, f *os.File, o vmm.LiveSave) error {
	half := len(v.stream) / 2
	if _, err := f.WriteString(v.stream[:half]); err != nil {
		return err
	}
	if err := o.Stopped(ctx, time.Now()); err != nil {
		return err
	}
	if _, err := f.WriteString(v.stream[half:]); err != nil {
		return err
	}
	return v.err
}
func (streamVM) Pause(context.Context) error                        { return nil }
func (streamVM) Resume(context.Context) error                       { return nil }
func (streamVM) SnapshotDisk(context.Context, string, string) error { return nil }
func (streamVM) Disks() []vmm.Disk                                  { return nil }
func (streamVM) Fingerprint() fingerprint.Fingerprint               { return fingerprint.Fingerprint{} }

// splittingRAM drops "RAM" from the stream, or fails after reading n
// bytes.
type splittingRAM struct {
	guestMemory
	failAfter int
}

func (splittingRAM) sync() error { return nil }

func (s splittingRAM) splitState(_ context.Context, _ *capture, state io.Reader, out io.Writer) error {
	if s.failAfter > 0 {
		if _, err := io.ReadFull(state, make([]byte, s.failAfter)); err != nil {
			return err
		}
		return errors.New("bad record")
	}
	b, err := io.ReadAll(state)
	if err != nil {
		return err
	}
	_, err = io.WriteString(out, strings.ReplaceAll(string(b), "RAM", ""))
	return err
}

// TestSaveStateSplits: a RAM that QEMU streams with the device state is
// saved live (the stop inside the save) and gets the stream as QEMU
// writes it, and the device state file holds what
// it passes on; a split that fails early still lets the migration end (the
// rest is drained) and fails the save; a migration that fails fails it,
// without waiting on a reader.
func TestStopAndSaveSplits(t *testing.T) {
	big := strings.Repeat("RAM", 1<<20) // beyond any pipe's buffer
	for _, c := range []struct {
		name    string
		vm      streamVM
		ram     splittingRAM
		want    string // the device state file, on success
		wantErr string
	}{
		{name: "split", vm: streamVM{stream: "head" + big + "tail"}, want: "headtail"},
		{name: "split fails", vm: streamVM{stream: "head" + big}, ram: splittingRAM{failAfter: 10}, wantErr: "bad record"},
		{name: "migration fails", vm: streamVM{stream: "head", err: errors.New("migration failed")}, wantErr: "migration failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cp := &capture{devstate: filepath.Join(t.TempDir(), "devstate")}
			done := make(chan error, 1)
			go func() {
				_, err := stopAndSave(context.Background(), c.vm, c.ram, cp, t.TempDir())
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("saveState hangs")
			}
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("saveState = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(cp.devstate)
			if err != nil || string(b) != c.want {
				t.Fatalf("device state %q (%v), want %q", b, err, c.want)
			}

		})
	}
}
