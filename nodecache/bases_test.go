package nodecache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

const baseSize = 1 << 20

var (
	storeA  = StoreID("file:///stores/a")
	storeB  = StoreID("file:///stores/b")
	digestA = digest.FromString("snapshot a")
	digestB = digest.FromString("snapshot b")
)

// basesFixture is a registry in a temp dir and a fill counter.
type basesFixture struct {
	b     *Bases
	fills string
}

func newBases(t *testing.T) *basesFixture {
	dir := t.TempDir()
	return &basesFixture{b: OpenBases(filepath.Join(dir, "bases")), fills: filepath.Join(dir, "fills")}
}

// share shares (store, d) in this process, writing tag if it fills.
func (x *basesFixture) share(t *testing.T, store string, d digest.Digest, tag string) *Base {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base, err := x.b.Share(ctx, store, d, baseSize, countingFill(x.fills, tag, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { base.Close() })
	return base
}

func (x *basesFixture) fillCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(x.fills)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func (x *basesFixture) child(t *testing.T, store string, d digest.Digest, tag string, delay time.Duration) *child {
	return startChild(t, childConfig{Dir: x.b.Dir(), Store: store, Digest: d, Size: baseSize, Fills: x.fills, Delay: delay, Tag: tag})
}

// records lists the holder records of (store, d).
func (x *basesFixture) records(t *testing.T, store string, d digest.Digest) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(x.b.Dir(), store+"-"+d.Encoded()))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func head(t *testing.T, f *os.File, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustID(t *testing.T, f *os.File) fileIdentity {
	t.Helper()
	id, err := fileID(f)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestBasesShareFillsOnceAndReuses: the first Share fills; later ones, in
// this process or another (a child shim), reuse that memfd and see its
// content, in both directions; another store or snapshot gets its own.
func TestBasesShareFillsOnceAndReuses(t *testing.T) {
	x := newBases(t)
	first := x.share(t, storeA, digestA, "tag-a")
	if first.Reused() || x.fillCount(t) != 1 || head(t, first.File(), 5) != "tag-a" {
		t.Fatalf("first share: reused %v, %d fills", first.Reused(), x.fillCount(t))
	}
	if first.Path() != "/proc/self/fd/"+itoa(int(first.File().Fd())) {
		t.Fatalf("Path() = %s", first.Path())
	}
	again := x.share(t, storeA, digestA, "other")
	if !again.Reused() || mustID(t, again.File()) != mustID(t, first.File()) || head(t, again.File(), 5) != "tag-a" {
		t.Fatalf("second share in this process: reused %v, a different memfd or content", again.Reused())
	}
	r := x.child(t, storeA, digestA, "other", 0).wait(t)
	if !r.Reused || (fileIdentity{r.Dev, r.Ino}) != mustID(t, first.File()) || r.Head != "tag-a" {
		t.Fatalf("child: %+v, want the parent's memfd", r)
	}
	if n := x.fillCount(t); n != 1 {
		t.Fatalf("%d fills for one key", n)
	}
	// The other way: a child fills, this process reuses it, and keeps it
	// after the child has gone.
	c := x.child(t, storeA, digestB, "tag-c", 0)
	if r := c.wait(t); r.Reused || r.Head != "tag-c" {
		t.Fatalf("child of a new key: %+v", r)
	}
	fromChild := x.share(t, storeA, digestB, "other")
	c.release(t)
	if !fromChild.Reused() || head(t, fromChild.File(), 5) != "tag-c" {
		t.Fatalf("reuse of the child's base: reused %v", fromChild.Reused())
	}
	// Another store of the same snapshot does not share.
	other := x.share(t, storeB, digestA, "tag-b")
	if other.Reused() || mustID(t, other.File()) == mustID(t, first.File()) || head(t, other.File(), 5) != "tag-b" {
		t.Fatalf("another store shared the base: reused %v", other.Reused())
	}
	if n := x.fillCount(t); n != 3 {
		t.Fatalf("%d fills for three keys", n)
	}
}

// TestBasesSealed: no descriptor, not even one reopened O_RDWR through
// the base's path, can write, truncate, grow or punch the base, or map it
// shared writable; a private writable mapping works and changes only its
// own view.
func TestBasesSealed(t *testing.T) {
	x := newBases(t)
	base := x.share(t, storeA, digestA, "sealed")
	rw, err := os.OpenFile(base.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("reopen O_RDWR (what QEMU does): %v", err)
	}
	defer rw.Close()
	fd := int(rw.Fd())
	denied := map[string]error{}
	_, denied["write"] = rw.WriteAt([]byte("x"), 0)
	denied["shrink"] = rw.Truncate(baseSize / 2)
	denied["grow"] = rw.Truncate(baseSize * 2)
	denied["punch"] = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096)
	denied["allocate past the end"] = unix.Fallocate(fd, 0, baseSize, 4096)
	_, denied["add a seal"] = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE)
	if m, err := unix.Mmap(fd, 0, baseSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		unix.Munmap(m)
		denied["shared writable mapping"] = nil
	} else {
		denied["shared writable mapping"] = err
	}
	for what, err := range denied {
		if err == nil {
			t.Errorf("%s through an O_RDWR descriptor: allowed", what)
		}
	}
	private, err := unix.Mmap(int(base.File().Fd()), 0, baseSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("private writable mapping: %v", err)
	}
	defer unix.Munmap(private)
	shared, err := unix.Mmap(fd, 0, baseSize, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("shared read-only mapping: %v", err)
	}
	defer unix.Munmap(shared)
	copy(private, "clone")
	if string(private[:5]) != "clone" || string(shared[:6]) != "sealed" || head(t, rw, 6) != "sealed" {
		t.Fatalf("a private write changed the base: shared view %q", shared[:6])
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != baseSize {
		t.Fatalf("size after the attempts: %d, %v", st.Size, err)
	}
}

// TestBasesCloseUnregisters: Close removes its own record only, twice is
// harmless, and once every holder closed the next Share fills anew.
func TestBasesCloseUnregisters(t *testing.T) {
	x := newBases(t)
	a := x.share(t, storeA, digestA, "one")
	b := x.share(t, storeA, digestA, "two")
	if got := x.records(t, storeA, digestA); len(got) != 2 {
		t.Fatalf("records of two holders: %v", got)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := x.records(t, storeA, digestA); len(got) != 1 || got[0] != itoa(os.Getpid())+"-"+itoa(int(b.File().Fd())) {
		t.Fatalf("records after one Close: %v", got)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := x.records(t, storeA, digestA); len(got) != 0 {
		t.Fatalf("records after every Close: %v", got)
	}
	c := x.share(t, storeA, digestA, "three")
	if c.Reused() || x.fillCount(t) != 2 || head(t, c.File(), 5) != "three" {
		t.Fatalf("share after every holder closed: reused %v, %d fills", c.Reused(), x.fillCount(t))
	}
}

// TestBasesConcurrentShareFillsOnce: two processes that share one key at
// once fill it once; the other waits and reuses it.
func TestBasesConcurrentShareFillsOnce(t *testing.T) {
	x := newBases(t)
	c1 := x.child(t, storeA, digestA, "concurrent", 300*time.Millisecond)
	c2 := x.child(t, storeA, digestA, "concurrent", 300*time.Millisecond)
	r1, r2 := c1.wait(t), c2.wait(t)
	if n := x.fillCount(t); n != 1 || r1.Reused == r2.Reused || r1.Ino != r2.Ino || r1.Head != "concurrent" || r2.Head != "concurrent" {
		t.Fatalf("%d fills; reports %+v, %+v", n, r1, r2)
	}
}

// TestBasesRefusesBadKeys: a store id or digest that is not one, or a
// size that is not positive, is refused by name before anything is made.
func TestBasesRefusesBadKeys(t *testing.T) {
	x := newBases(t)
	for _, c := range []struct {
		store string
		d     digest.Digest
		size  int64
		want  string
	}{
		{"", digestA, baseSize, "store id"},
		{"../../etc", digestA, baseSize, "store id"},
		{strings.ToUpper(storeA), digestA, baseSize, "store id"},
		{storeA, "", baseSize, "digest"},
		{storeA, "sha256:../../x", baseSize, "digest"},
		{storeA, digest.SHA512.FromString("x"), baseSize, "digest"},
		{storeA, digestA, 0, "size"},
		{storeA, digestA, -1, "size"},
	} {
		_, err := x.b.Share(context.Background(), c.store, c.d, c.size, countingFill(x.fills, "x", 0))
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Share(%q, %q, %d) = %v, want an invalid %s", c.store, c.d, c.size, err, c.want)
		}
	}
	if _, err := os.Stat(x.b.Dir()); !errors.Is(err, os.ErrNotExist) || x.fillCount(t) != 0 {
		t.Fatalf("refused shares made %s (%v) or filled", x.b.Dir(), err)
	}
}

// TestBasesFailureLeavesNothing: a fill that fails, or a wait for the
// key's lock that outlasts ctx, leaves no record and no descriptor.
func TestBasesFailureLeavesNothing(t *testing.T) {
	x := newBases(t)
	fds := countFDs(t)
	boom := errors.New("boom")
	_, err := x.b.Share(context.Background(), storeA, digestA, baseSize, func(*os.File) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Share with a failing fill = %v", err)
	}
	if got := x.records(t, storeA, digestA); len(got) != 0 || countFDs(t) != fds {
		t.Fatalf("a failed fill left records %v or descriptors (%d, were %d)", got, countFDs(t), fds)
	}
	lock, err := os.OpenFile(filepath.Join(x.b.Dir(), storeA+"-"+digestA.Encoded()+".lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	fds = countFDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := x.b.Share(ctx, storeA, digestA, baseSize, countingFill(x.fills, "x", 0)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Share while another holds the key's lock = %v, want the deadline", err)
	}
	if got := x.records(t, storeA, digestA); len(got) != 0 || countFDs(t) != fds || x.fillCount(t) != 0 {
		t.Fatalf("a timed-out share left records %v, descriptors or fills", got)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
