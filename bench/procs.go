package bench

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// procMem is the summed memory of some processes.
type procMem struct{ rss, pss int64 }

// qemuMem sums Rss and Pss (bytes) of pids from /proc/<pid>/smaps_rollup.
// Pss divides each shared page among the processes that map it, so the
// sum is what the clones cost the node together.
func qemuMem(pids []int) procMem {
	var m procMem
	for _, pid := range pids {
		f := procFields("/proc/"+strconv.Itoa(pid)+"/smaps_rollup", "Rss:", "Pss:")
		m.rss += f["Rss:"]
		m.pss += f["Pss:"]
	}
	return m
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
