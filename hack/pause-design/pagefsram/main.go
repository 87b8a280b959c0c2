// Command pagefsram is a throwaway prototype for the pause design
// experiment (docs/design/constant-time-pause.md), not part of cryo: it
// serves an all-zero layered pagefs file as a booted guest's RAM, so that
// the guest's speed on a served RAM can be measured against tmpfs, and the
// pause (sync, seal) timed. Commands on stdin: "sync", "seal", "close",
// "quit"; each answers one line on stdout.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/pagefs"
)

// zeros is a Source of size zero bytes: a booted guest's RAM before it
// runs.
type zeros int64

func (z zeros) Size() int64 { return int64(z) }

func (z zeros) ReadAt(p []byte, off int64) (int, error) {
	clear(p)
	return len(p), nil
}

func main() {
	dir := flag.String("dir", "", "mount point")
	mib := flag.Int64("mib", 512, "RAM size in MiB")
	flag.Parse()
	if err := run(*dir, *mib<<20); err != nil {
		fmt.Fprintln(os.Stderr, "pagefsram:", err)
		os.Exit(1)
	}
}

func run(dir string, size int64) error {
	layer, err := os.CreateTemp("/dev/shm", "pd-layer-")
	if err != nil {
		return err
	}
	defer os.Remove(layer.Name())
	if err := layer.Truncate(size); err != nil {
		return err
	}
	f, err := pagefs.NewLayered("ram", zeros(size), layer)
	if err != nil {
		return err
	}
	srv, err := pagefs.Mount(dir, []*pagefs.File{f}, pagefs.Options{})
	if err != nil {
		return err
	}
	defer srv.Unmount()
	// Nothing is written back while the guest runs, up to its whole RAM:
	// the sync before the pause writes it.
	if err := srv.TuneWriteback(size); err != nil {
		// max_bytes above the global dirty limit is refused: let the
		// mount use all of that limit instead.
		fmt.Fprintln(os.Stderr, "pagefsram:", err, "; max_ratio=100 instead")
		if err := maxRatio(dir); err != nil {
			return err
		}
	}
	ram, err := os.OpenFile(srv.Path("ram"), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer ram.Close()
	fmt.Println("ready", srv.Path("ram"))
	var gen *pagefs.Generation
	var side *os.File
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		t := time.Now()
		switch in.Text() {
		case "sync":
			err = ram.Sync()
			fmt.Printf("sync %.2f ms err=%v stats=%+v\n", ms(t), err, f.Stats())
		case "seal":
			if side, err = os.CreateTemp("/dev/shm", "pd-side-"); err == nil {
				gen, err = f.Seal(side)
			}
			pages := 0
			if gen != nil {
				pages = len(gen.Pages())
			}
			fmt.Printf("seal %.2f ms err=%v pages=%d\n", ms(t), err, pages)
		case "close":
			if gen != nil {
				gen.Close()
				gen = nil
			}
			if side != nil {
				os.Remove(side.Name())
				side = nil
			}
			fmt.Printf("close %.2f ms\n", ms(t))
		case "quit":
			fmt.Println("bye")
			return nil
		}
	}
	return in.Err()
}

// maxRatio lets the mount's bdi use the whole global dirty limit.
func maxRatio(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	return os.WriteFile(fmt.Sprintf("/sys/class/bdi/0:%d/max_ratio", unix.Minor(st.Dev)), []byte("100"), 0)
}

func ms(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1e3 }
