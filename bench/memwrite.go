package bench

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// MemWriterName is the name under which cryoctl runs the guest memory
// writer instead of its commands (a multi-call binary, as busybox is): the
// bench copies the static cryoctl into its writer image under this name,
// so the guest needs no compiler and the host no second binary.
const MemWriterName = "cryo-memw"

// memwPeriod is how often the writer reports: short against the windows
// the bench compares (seconds), so a report's age moves a rate little.
const memwPeriod = 50 * time.Millisecond

// MemWriter is the guest's memory-write benchmark (issue 21): it allocates
// args[0] MiB and writes every 4 KiB page of it whole, sweep after sweep,
// as fast as it can, so that every page is dirty again every sweep (the
// worst case for a checkpoint that tracks or copies written pages). Every
// memwPeriod it appends "W <sweeps done> <bytes written> E" to out; a line
// a reader sees cut short lacks the final E. It returns an exit code.
func MemWriter(args []string, out, errw io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(errw, "usage: %s MIB\n", MemWriterName)
		return 2
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 {
		fmt.Fprintf(errw, "%s: MiB %q: want a positive integer\n", MemWriterName, args[0])
		return 2
	}
	if err := memWrite(n, 0, out); err != nil {
		fmt.Fprintf(errw, "%s: report: %v\n", MemWriterName, err)
		return 1
	}
	return 0
}

// memWrite writes every page of n MiB whole, sweeps times (0: forever),
// and reports to out as MemWriter says.
func memWrite(n int, sweeps uint64, out io.Writer) error {
	buf := make([]byte, n<<20)
	page := make([]byte, 4096)
	var written int64
	last := time.Now()
	for sweep := uint64(1); sweeps == 0 || sweep <= sweeps; sweep++ {
		// A page of one sweep is the same everywhere and changes every
		// sweep: never zero (a zero page could stay a hole), and it
		// compresses, so the snapshots stay small.
		for i := 0; i < len(page); i += 8 {
			binary.LittleEndian.PutUint64(page[i:], sweep<<32|uint64(i)|1)
		}
		for off := 0; off < len(buf); off += len(page) {
			copy(buf[off:], page)
			written += int64(len(page))
			if off&(63<<12) == 0 && time.Since(last) >= memwPeriod {
				last = time.Now()
				if _, err := fmt.Fprintf(out, "W %d %d E\n", sweep-1, written); err != nil {
					return err
				}
			}
		}
		last = time.Now()
		if _, err := fmt.Fprintf(out, "W %d %d E\n", sweep, written); err != nil {
			return err
		}
	}
	return nil
}

// memwSample is one reading of the writer's report.
type memwSample struct {
	at      time.Time // the host's clock when it was read
	sweeps  int64
	written int64 // bytes
}

// parseMemw returns the last complete report in the tail of the writer's
// output (a line being written when it was read is skipped).
func parseMemw(tail string) (memwSample, error) {
	var s memwSample
	found := false
	sc := bufio.NewScanner(strings.NewReader(tail))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "W" || f[3] != "E" {
			continue
		}
		sw, err1 := strconv.ParseInt(f[1], 10, 64)
		b, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || sw < 0 || b < 0 {
			continue
		}
		s.sweeps, s.written, found = sw, b, true
	}
	if !found {
		return s, fmt.Errorf("no complete report in the writer's output %q", tail)
	}
	return s, nil
}

// writeRate is the writer's speed between two samples in MiB/s (0 when
// the samples are not in order).
func writeRate(a, b memwSample) float64 {
	d := b.at.Sub(a.at).Seconds()
	if d <= 0 || b.written < a.written {
		return 0
	}
	return mib(b.written-a.written) / d
}

// staticELF checks that the binary at path runs without a dynamic loader:
// the guest's image has no libc.
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (build it with CGO_ENABLED=0, as `make binaries` does)")
		}
	}
	return nil
}
