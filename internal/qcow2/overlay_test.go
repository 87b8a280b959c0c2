package qcow2

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func qemuTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: install Debian's qemu-utils (make deps does)", name)
	}
	return p
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(qemuTool(t, name), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// QEMU's own tools accept the overlay: a consistent image of the right
// size over its raw backing file, reading as the backing file, taking
// writes that leave the backing file alone.
func TestCreateOverlay(t *testing.T) {
	for _, size := range []int64{300 << 20, 600<<20 + 512} {
		dir := t.TempDir()
		base := filepath.Join(dir, "base.raw")
		data := bytes.Repeat([]byte("cryo"), 1<<14)
		if err := os.WriteFile(base, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(base, size); err != nil {
			t.Fatal(err)
		}
		ov := filepath.Join(dir, "overlay.qcow2")
		if err := CreateOverlay(ov, base, size); err != nil {
			t.Fatal(err)
		}
		if st, _ := os.Stat(ov); st.Mode().Perm() != 0o600 {
			t.Fatalf("overlay mode %v, want 0600", st.Mode().Perm())
		}
		run(t, "qemu-img", "check", ov)
		var info struct {
			Format         string `json:"format"`
			VirtualSize    int64  `json:"virtual-size"`
			Backing        string `json:"backing-filename"`
			BackingFormat  string `json:"backing-filename-format"`
			FormatSpecific struct {
				Data struct {
					Compat       string `json:"compat"`
					RefcountBits int    `json:"refcount-bits"`
				} `json:"data"`
			} `json:"format-specific"`
		}
		if err := json.Unmarshal(run(t, "qemu-img", "info", "--output=json", ov), &info); err != nil {
			t.Fatal(err)
		}
		if info.Format != "qcow2" || info.VirtualSize != size || info.Backing != base || info.BackingFormat != "raw" ||
			info.FormatSpecific.Data.Compat != "1.1" || info.FormatSpecific.Data.RefcountBits != 16 {
			t.Fatalf("qemu-img info: %+v", info)
		}
		run(t, "qemu-img", "compare", "-f", "qcow2", "-F", "raw", ov, base)

		run(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0xab 4096 131072", "-c", "write -P 0xcd "+itoa(size-65536)+" 65536", ov)
		run(t, "qemu-img", "check", ov)
		flat := filepath.Join(dir, "flat.raw")
		run(t, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", ov, flat)
		got, err := os.ReadFile(flat)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, size)
		copy(want, data)
		copy(want[4096:4096+131072], bytes.Repeat([]byte{0xab}, 131072))
		copy(want[size-65536:], bytes.Repeat([]byte{0xcd}, 65536))
		if !bytes.Equal(got, want) {
			t.Fatalf("size %d: overlay after writes reads differently than expected", size)
		}
		if b, _ := os.ReadFile(base); !bytes.Equal(b[:len(data)], data) {
			t.Fatal("writes to the overlay reached the backing file")
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestCreateOverlayRefuses(t *testing.T) {
	dir := t.TempDir()
	ov := filepath.Join(dir, "o.qcow2")
	for _, tc := range []struct {
		backing string
		size    int64
	}{
		{"/base", 0},
		{"/base", 1000},
		{"/base", 5 << 40},
		{"", 1 << 20},
		{"/" + strings.Repeat("b", 2000), 1 << 20},
	} {
		if err := CreateOverlay(ov, tc.backing, tc.size); err == nil {
			t.Errorf("CreateOverlay(%q, %d) succeeded", tc.backing, tc.size)
		}
		if _, err := os.Stat(ov); err == nil {
			t.Fatalf("a refused overlay left %s", ov)
		}
	}
	if err := os.WriteFile(ov, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CreateOverlay(ov, "/base", 1<<20); err == nil {
		t.Fatal("CreateOverlay overwrote an existing file")
	}
	if b, _ := os.ReadFile(ov); string(b) != "x" {
		t.Fatal("a refused overlay changed the existing file")
	}
}
