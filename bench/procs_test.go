package bench

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLargestFileMappingPss: the guest RAM mapping is the largest
// file-backed range, whatever its Pss; anonymous ranges (TCG's code
// buffer is larger) and smaller files do not count.
func TestLargestFileMappingPss(t *testing.T) {
	smaps := `55cf129d1000-55cf12dd8000 r--p 00000000 fe:01 123 /usr/bin/qemu-system-x86_64
Size:               4124 kB
Pss:                2062 kB
VmFlags: rd mr mw me sd
7fc09ffff000-7fc0affff000 rw-s 00000000 00:2d 456 /dev/shm/cryo-it/cryo-1.ram (deleted)
Size:             262144 kB
Rss:              130000 kB
Pss:               64000 kB
VmFlags: rd wr sh mr mw me ms sd
7fc0c8000000-7fc107fff000 rwxp 00000000 00:00 0 
Size:            1048572 kB
Pss:               75776 kB
VmFlags: rd wr ex mr mw me ac sd
7fc10a000000-7fc10a100000 r-xp 00000000 fe:01 789 /usr/lib/x86_64-linux-gnu/libglib-2.0.so.0
Size:               1024 kB
Pss:                 900 kB
`
	path := filepath.Join(t.TempDir(), "smaps")
	if err := os.WriteFile(path, []byte(smaps), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := largestFileMappingPss(path); got != 64000<<10 {
		t.Errorf("guest RAM Pss %d, want %d", got, 64000<<10)
	}
	if got := largestFileMappingPss(filepath.Join(t.TempDir(), "none")); got != 0 {
		t.Errorf("missing smaps: %d, want 0", got)
	}
}
