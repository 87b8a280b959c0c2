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
