package vmm

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// bzImage returns a file shaped as the x86 boot protocol says: setup_sects
// at 0x1f1, "HdrS" at 0x202, then the setup sectors and a payload.
func bzImage(t *testing.T, sects byte, payload int) (string, []byte) {
	t.Helper()
	n := int(sects)
	if n == 0 {
		n = 4
	}
	b := make([]byte, (n+1)*512+payload)
	for i := range b {
		b[i] = byte(i * 7)
	}
	b[bootSetupSects] = sects
	binary.LittleEndian.PutUint32(b[bootHeaderAt:], bootMagic)
	p := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func TestKernelStub(t *testing.T) {
	for _, sects := range []byte{0, 1, 27, 255} {
		path, img := bzImage(t, sects, 3<<20)
		f, err := kernelStub(path)
		if err != nil {
			t.Fatalf("setup_sects %d: %v", sects, err)
		}
		defer f.Close()
		got, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		n := int(sects)
		if n == 0 {
			n = 4
		}
		setup := (n + 1) * 512
		if len(got) != setup+stubPayload || !bytes.Equal(got[:setup], img[:setup]) || !bytes.Equal(got[setup:], make([]byte, stubPayload)) {
			t.Errorf("setup_sects %d: stub of %d bytes, want the %d setup bytes and %d zeros", sects, len(got), setup, stubPayload)
		}
		if seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&Seals != Seals {
			t.Errorf("setup_sects %d: seals %#x (%v), want %#x", sects, seals, err, Seals)
		}
	}
}

func TestKernelStubRefusals(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	_, img := bzImage(t, 30, 0)
	noMagic := bytes.Clone(img)
	copy(noMagic[bootHeaderAt:], "ELF!")
	for name, c := range map[string]struct {
		path, want string
	}{
		"missing":           {filepath.Join(dir, "none"), "no such file"},
		"shorter than head": {write("short", img[:0x100]), "boot header"},
		"not a bzImage":     {write("elf", noMagic), errNoBootHeader.Error()},
		"setup past end":    {write("cut", img[:20*512]), "setup sectors (15872 bytes)"},
	} {
		f, err := kernelStub(c.path)
		if err == nil {
			f.Close()
			t.Errorf("%s: a stub was made", name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}
