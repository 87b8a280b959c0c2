package nodecache

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/safefs"
)

func itoa(i int) string { return strconv.Itoa(i) }

// sealedBase makes a genuine base of key in this process (as Share's
// fill does) and the record that describes it; it is closed at the end of
// the test.
func sealedBase(t *testing.T, key string, size int64) (*os.File, holderRecord) {
	t.Helper()
	f, err := fillBase(key, size, func(*os.File) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	rec, err := selfRecord(f, size)
	if err != nil {
		t.Fatal(err)
	}
	return f, rec
}

// recordOf describes f, held by this process, as a record would.
func recordOf(t *testing.T, f *os.File, size int64) holderRecord {
	t.Helper()
	rec, err := selfRecord(f, size)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func plant(t *testing.T, dir, name string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func plantRecord(t *testing.T, dir string, rec holderRecord) string {
	t.Helper()
	b, _ := json.Marshal(rec)
	plant(t, dir, rec.name(), b)
	return rec.name()
}

// deadPID returns the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("run true: %v", err)
	}
	return cmd.Process.Pid
}

// nobodyHolding starts a process as uid 65534 that holds f at fd 3 (a
// QEMU that got a dead shim's pid, holding a memfd of its own making),
// and returns the record that would describe it.
func nobodyHolding(t *testing.T, f *os.File, size int64) holderRecord {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleep as nobody: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	rec := recordOf(t, f, size)
	rec.PID, rec.FD = cmd.Process.Pid, 3
	for range 1000 { // until the child has dropped root
		start, uids, err := processIdentity(rec.PID)
		if err == nil && strings.HasPrefix(uids, "65534") {
			rec.Start = start
			return rec
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the child never ran as nobody")
	return rec
}

// TestBasesRefusesInvalidHolders: a record is only a hint. Each of these
// names no usable base: Share does not reuse it, removes it, and fills.
func TestBasesRefusesInvalidHolders(t *testing.T) {
	key := storeA + "-" + digestA.Encoded()
	for _, c := range []struct {
		name  string
		plant func(t *testing.T, holders string) string // returns the planted name
	}{
		{"dead holder", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, key, baseSize)
			rec.PID = deadPID(t)
			return plantRecord(t, h, rec)
		}},
		{"pid reused (start time differs)", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, key, baseSize)
			rec.Start++
			return plantRecord(t, h, rec)
		}},
		{"holder not root", func(t *testing.T, h string) string {
			f, _ := sealedBase(t, key, baseSize)
			return plantRecord(t, h, nobodyHolding(t, f, baseSize))
		}},
		{"earlier boot", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, key, baseSize)
			rec.Boot = "an earlier boot"
			return plantRecord(t, h, rec)
		}},
		{"not a memfd", func(t *testing.T, h string) string {
			f, err := os.Create(filepath.Join(t.TempDir(), "ram"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			f.Truncate(baseSize)
			return plantRecord(t, h, recordOf(t, f, baseSize))
		}},
		{"dev/ino differ", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, key, baseSize)
			rec.Ino++
			return plantRecord(t, h, rec)
		}},
		{"seals missing", func(t *testing.T, h string) string {
			fd, err := unix.MemfdCreate(memfdName(key), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
			if err != nil {
				t.Fatal(err)
			}
			f := os.NewFile(uintptr(fd), "memfd")
			t.Cleanup(func() { f.Close() })
			f.Truncate(baseSize)
			unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
			return plantRecord(t, h, recordOf(t, f, baseSize))
		}},
		{"another key's memfd", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, storeB+"-"+digestA.Encoded(), baseSize)
			return plantRecord(t, h, rec)
		}},
		{"record of another size", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, key, 2*baseSize)
			return plantRecord(t, h, rec)
		}},
		{"memfd of another size", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, key, 2*baseSize)
			rec.Size = baseSize
			return plantRecord(t, h, rec)
		}},
		{"malformed", func(t *testing.T, h string) string {
			plant(t, h, "1-3", []byte("{not json"))
			return "1-3"
		}},
		{"unknown field", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, key, baseSize)
			b, _ := json.Marshal(rec)
			plant(t, h, rec.name(), append(b[:len(b)-1], []byte(`,"extra":1}`)...))
			return rec.name()
		}},
		{"name disagrees", func(t *testing.T, h string) string {
			_, rec := sealedBase(t, key, baseSize)
			b, _ := json.Marshal(rec)
			plant(t, h, "1-1", b)
			return "1-1"
		}},
		{"oversized", func(t *testing.T, h string) string {
			plant(t, h, "1-4", make([]byte, 2*recordLimit))
			return "1-4"
		}},
		{"FIFO", func(t *testing.T, h string) string {
			os.MkdirAll(h, 0o700)
			if err := unix.Mkfifo(filepath.Join(h, "1-5"), 0o600); err != nil {
				t.Fatal(err)
			}
			return "1-5"
		}},
		{"symlink to a valid record", func(t *testing.T, h string) string {
			// A live base with a valid record elsewhere: only a followed
			// symlink would find it.
			_, rec := sealedBase(t, key, baseSize)
			elsewhere := t.TempDir()
			target := filepath.Join(elsewhere, plantRecord(t, elsewhere, rec))
			os.MkdirAll(h, 0o700)
			if err := os.Symlink(target, filepath.Join(h, rec.name())); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if _, err := os.Stat(target); err != nil {
					t.Errorf("the symlink's target: %v", err)
				}
			})
			return rec.name()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := newBases(t)
			planted := c.plant(t, filepath.Join(x.b.Dir(), key))
			base := x.share(t, storeA, digestA, "fresh")
			own := itoa(os.Getpid()) + "-" + itoa(int(base.File().Fd()))
			if base.Reused() || x.fillCount(t) != 1 || head(t, base.File(), 5) != "fresh" {
				t.Fatalf("reused %v, %d fills", base.Reused(), x.fillCount(t))
			}
			if got := x.records(t, storeA, digestA); len(got) != 1 || got[0] != own {
				t.Fatalf("records %v, want only %s (planted %s removed)", got, own, planted)
			}
		})
	}
}

// TestBasesRefusesSymlinkedPlaces: a symlink where the key's directory or
// lock should be is refused, not followed: nothing is made at its target.
func TestBasesRefusesSymlinkedPlaces(t *testing.T) {
	key := storeA + "-" + digestA.Encoded()
	for _, name := range []string{key, key + ".lock"} {
		x := newBases(t)
		target := filepath.Join(t.TempDir(), "target")
		os.MkdirAll(x.b.Dir(), 0o700)
		if err := os.Symlink(target, filepath.Join(x.b.Dir(), name)); err != nil {
			t.Fatal(err)
		}
		_, err := x.b.Share(context.Background(), storeA, digestA, baseSize, countingFill(x.fills, "x", 0))
		if !errors.Is(err, safefs.ErrUnsafe) {
			t.Errorf("Share with %s a symlink = %v, want a refusal", name, err)
		}
		if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) || x.fillCount(t) != 0 {
			t.Errorf("Share with %s a symlink made its target (%v) or filled", name, err)
		}
	}
}

// TestNodePruneBases: Node.Prune removes dead holders' records (a dry run
// only counts them), keeps live ones, and removes the keys left without a
// holder.
func TestNodePruneBases(t *testing.T) {
	ctx := context.Background()
	node, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	x := &basesFixture{b: node.Bases(), fills: filepath.Join(node.Dir(), "fills")}
	if x.b.Dir() != BasesDir(node.Dir()) {
		t.Fatalf("bases in %s", x.b.Dir())
	}
	live := x.share(t, storeA, digestA, "live")
	liveKey := filepath.Join(x.b.Dir(), storeA+"-"+digestA.Encoded())
	_, dead := sealedBase(t, storeA+"-"+digestA.Encoded(), baseSize)
	dead.Start++
	plantRecord(t, liveKey, dead)
	goneKey := storeA + "-" + digestB.Encoded()
	_, dead2 := sealedBase(t, goneKey, baseSize)
	dead2.PID = deadPID(t)
	plantRecord(t, filepath.Join(x.b.Dir(), goneKey), dead2)

	res, err := node.Prune(ctx, PruneOptions{DryRun: true})
	if err != nil || res.Bases != (BasePruneStats{Live: 1, Removed: 2}) {
		t.Fatalf("dry run: %+v, %v", res.Bases, err)
	}
	if len(x.records(t, storeA, digestA)) != 2 || len(x.records(t, storeA, digestB)) != 1 {
		t.Fatal("a dry run removed records")
	}
	if res, err = node.Prune(ctx, PruneOptions{}); err != nil || res.Bases != (BasePruneStats{Live: 1, Removed: 2}) {
		t.Fatalf("prune: %+v, %v", res.Bases, err)
	}
	own := itoa(os.Getpid()) + "-" + itoa(int(live.File().Fd()))
	if got := x.records(t, storeA, digestA); len(got) != 1 || got[0] != own {
		t.Fatalf("live key's records after prune: %v", got)
	}
	for _, p := range []string{goneKey, goneKey + ".lock"} {
		if _, err := os.Lstat(filepath.Join(x.b.Dir(), p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of a key no process holds: %v", p, err)
		}
	}
	if again := x.share(t, storeA, digestA, "x"); !again.Reused() {
		t.Fatal("the live base was not found after prune")
	}
}
