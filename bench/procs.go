package bench

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"time"
)

// procMem is the summed memory of some processes.
type procMem struct{ rss, pss int64 }

// procsMem sums Rss and Pss (bytes) of pids (QEMUs, or shims) from
// /proc/<pid>/smaps_rollup. Pss divides each shared page among the processes that map it, so the
// sum is what the clones cost the node together.
func procsMem(pids []int) procMem {
	var m procMem
	for _, pid := range pids {
		f := procFields("/proc/"+strconv.Itoa(pid)+"/smaps_rollup", "Rss:", "Pss:")
		m.rss += f["Rss:"]
		m.pss += f["Pss:"]
	}
	return m
}

// guestRAMPss sums, over pids, the Pss (bytes) of each process's guest RAM
// mapping: its largest file-backed mapping (the memory-backend file is
// the VM's size; libraries and the binary are a few MiB). What is left of
// a QEMU's Pss is its own memory: heap, device buffers and, under TCG, the
// translated code, none of which clones of one snapshot can share.
func guestRAMPss(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		sum += largestFileMappingPss("/proc/" + strconv.Itoa(pid) + "/smaps")
	}
	return sum
}

// largestFileMappingPss reads a smaps file: the Pss of the file-backed
// mapping with the largest address range.
func largestFileMappingPss(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var best, size, pss int64
	file := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) >= 5 && strings.Contains(fs[0], "-") && !strings.HasSuffix(fs[0], ":"):
			start, end, ok := strings.Cut(fs[0], "-")
			lo, err1 := strconv.ParseUint(start, 16, 64)
			hi, err2 := strconv.ParseUint(end, 16, 64)
			size, file = 0, false
			if ok && err1 == nil && err2 == nil && hi > lo {
				size = int64(hi - lo)
				file = len(fs) >= 6 && strings.HasPrefix(fs[5], "/")
			}
		case len(fs) >= 2 && fs[0] == "Pss:" && file && size > best:
			if n, err := strconv.ParseInt(fs[1], 10, 64); err == nil {
				best, pss = size, n<<10
			}
		}
	}
	return pss
}

// vmHWM is a process's peak resident set size in bytes.
func vmHWM(pid int) int64 {
	return procFields("/proc/"+strconv.Itoa(pid)+"/status", "VmHWM:")["VmHWM:"]
}

// procFields reads "Key: <n> kB" lines of a /proc file, in bytes.
func procFields(path string, keys ...string) map[string]int64 {
	out := map[string]int64{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		for _, k := range keys {
			if fs[0] == k {
				if n, err := strconv.ParseInt(fs[1], 10, 64); err == nil {
					out[k] = n << 10
				}
			}
		}
	}
	return out
}

// cpuTime sums user and system CPU time of pids (/proc/<pid>/stat fields
// 14 and 15, in clock ticks of 1/100 s).
func cpuTime(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// The command name (field 2) may hold spaces: split after its ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // f[0] is field 3
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
