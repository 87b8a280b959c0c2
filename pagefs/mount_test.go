package pagefs

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
)

// asUID runs fn on a thread whose filesystem uid is uid (what FUSE reports
// as the caller). The thread is not reused: it ends with the goroutine.
func asUID(t *testing.T, uid int, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with us
		if err := syscall.Setfsuid(uid); err != nil {
			t.Errorf("setfsuid %d: %v", uid, err)
			return
		}
		fn()
	}()
	<-done
}

// TestMountAdmitsOnlyAllowedUIDs: pagefs itself refuses to open or change
// a served file for any uid but root and the allowed ones, whatever the
// directories above the mount allow; Allow admits a uid later.
func TestMountAdmitsOnlyAllowedUIDs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting pagefs needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	const admitted, stranger = 61234, 61235
	base, data := baseFile(t, 128<<10)
	// Open to all above the mount: only pagefs may refuse.
	dir, err := os.MkdirTemp("", "pagefs-acl-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := Mount(mnt, []*File{NewReadOnly("ram", base)}, Options{AllowUIDs: []uint32{admitted}})
	if err != nil {
		t.Skipf("mount: %v", err)
	}
	defer srv.Unmount()
	path := srv.Path("ram")

	read := func() error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		b := make([]byte, PageSize)
		if _, err := f.ReadAt(b, 0); err != nil {
			return err
		}
		if string(b) != string(data[:PageSize]) {
			return errors.New("wrong content")
		}
		return nil
	}
	if err := read(); err != nil {
		t.Fatalf("root: %v", err)
	}
	asUID(t, stranger, func() {
		if err := read(); !errors.Is(err, syscall.EACCES) {
			t.Errorf("uid %d opened the served file: %v; want EACCES", stranger, err)
		}
		if err := os.Truncate(path, int64(len(data))); !errors.Is(err, syscall.EACCES) {
			t.Errorf("uid %d changed the served file: %v; want EACCES", stranger, err)
		}
	})
	asUID(t, admitted, func() {
		if err := read(); err != nil {
			t.Errorf("allowed uid %d: %v", admitted, err)
		}
	})
	srv.Allow(stranger)
	asUID(t, stranger, func() {
		if err := read(); err != nil {
			t.Errorf("uid %d after Allow: %v", stranger, err)
		}
	})
}

// TestPreSyncAndSealThroughTheMount: a guest's writes to a shared mapping
// of the served file reach the dirty set by writeback alone; PreSync's
// fsyncs bring every one of them, its last pass finds nothing once the
// writer is gone, and a generation sealed then reads that content while
// the file is written on. The writer is another process, as QEMU is: a
// process faulting on its own mount can deadlock with its server.
func TestPreSyncAndSealThroughTheMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting pagefs needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	const size = 4 << 20
	f, side := layeredOver(t, size)
	mnt := t.TempDir()
	srv, err := Mount(mnt, []*File{f}, Options{})
	if err != nil {
		t.Skipf("mount: %v", err)
	}
	defer srv.Unmount()
	ram, err := os.OpenFile(srv.Path("ram"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()

	var want []int64
	sealed := make([]byte, size)
	for pg := int64(0); pg < size/PageSize; pg += 7 {
		want = append(want, pg)
		sealed[pg*PageSize+pg%PageSize] = mappedByte(pg, 0)
	}
	writeMapped(t, srv.Path("ram"), 7, 0)
	st, err := f.PreSync(ram.Sync, PreSyncOptions{Settled: 1})
	if err != nil {
		t.Fatal(err)
	}
	if st.Last != 0 || st.Passes > 2 {
		t.Errorf("presync %+v: want a last pass that wrote nothing", st)
	}
	if got := f.DirtyPages(); !slices.Equal(got, want) || f.DirtyCount() != int64(len(want)) {
		t.Errorf("dirty %d pages (DirtyCount %d), want %d", len(got), f.DirtyCount(), len(want))
	}
	g, err := f.Seal(side)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	writeMapped(t, srv.Path("ram"), 2, 0x80) // sealed pages and zero ones
	if _, err := f.PreSync(ram.Sync, PreSyncOptions{}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := g.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sealed) {
		t.Error("the generation does not read the content at the seal")
	}
	now := slices.Clone(sealed)
	for pg := int64(0); pg < size/PageSize; pg += 2 {
		now[pg*PageSize+pg%PageSize] = mappedByte(pg, 0x80)
	}
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, now) {
		t.Errorf("the file does not read the writes after the seal (%v)", err)
	}
	if n := f.DirtyCount(); n != size/PageSize/2 {
		t.Errorf("DirtyCount since the seal %d, want %d", n, size/PageSize/2)
	}
	if !slices.Equal(g.Pages(), want) {
		t.Errorf("generation pages: %d, want %d", len(g.Pages()), len(want))
	}
}

// mappedByte is what a mapped writer writes in page pg: never 0, and
// another value for another mask.
func mappedByte(pg int64, mask byte) byte { return (byte(pg)&0x7e | 1) ^ mask }

// writeMapped runs this test binary as a writer that maps path shared and
// writes one byte (mappedByte) in every stride-th page, then exits
// without syncing:
// its pages are left dirty in the page cache.
func writeMapped(t *testing.T, path string, stride int, mask byte) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMappedWriter$")
	cmd.Env = append(os.Environ(), "PAGEFS_MAPPED_WRITER="+path, "PAGEFS_MAPPED_STRIDE="+strconv.Itoa(stride), "PAGEFS_MAPPED_MASK="+strconv.Itoa(int(mask)))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mapped writer: %v: %s", err, out)
	}
}

// TestMappedWriter is writeMapped's child; it does nothing in a test run.
func TestMappedWriter(t *testing.T) {
	path := os.Getenv("PAGEFS_MAPPED_WRITER")
	if path == "" {
		t.Skip("the child of writeMapped")
	}
	stride, err := strconv.ParseInt(os.Getenv("PAGEFS_MAPPED_STRIDE"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	mask, err := strconv.ParseUint(os.Getenv("PAGEFS_MAPPED_MASK"), 10, 8)
	if err != nil {
		t.Fatal(err)
	}
	ram, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	st, err := ram.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := syscall.Mmap(int(ram.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	for pg := int64(0); pg < st.Size()/PageSize; pg += stride {
		m[pg*PageSize+pg%PageSize] = mappedByte(pg, byte(mask))
	}
	if err := syscall.Munmap(m); err != nil {
		t.Fatal(err)
	}
}
