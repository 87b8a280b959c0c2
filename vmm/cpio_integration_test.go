//go:build integration

package vmm

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strings"
)

// cpioWriter writes a "newc" cpio archive, the format the kernel unpacks as
// an initramfs. Writing it here needs neither the cpio tool nor root (for
// the /dev/console node).
type cpioWriter struct {
	w   *bufio.Writer
	ino int
	n   int64
}

func (c *cpioWriter) entry(name string, mode uint32, rdevMajor, rdevMinor int, data []byte) error {
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	for _, b := range [][]byte{[]byte(hdr), []byte(name), {0}} {
		c.write(b)
	}
	c.pad()
	c.write(data)
	c.pad()
	return nil
}

func (c *cpioWriter) write(b []byte) {
	n, _ := c.w.Write(b)
	c.n += int64(n)
}

func (c *cpioWriter) pad() {
	for c.n%4 != 0 {
		c.write([]byte{0})
	}
}

// writeInitrd writes an initramfs with busybox as /bin/sh (and its applets),
// init as /init, modulesLoad as /modules.load and files (archive path ->
// host path).
func writeInitrd(out, busybox, init, modulesLoad string, files map[string]string) error {
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	c := &cpioWriter{w: bufio.NewWriter(f)}
	const dir, reg, chr, lnk = 0o040000, 0o100000, 0o020000, 0o120000
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "lib", "lib/modules"} {
		c.entry(d, dir|0o755, 0, 0, nil)
	}
	c.entry("dev/console", chr|0o600, 5, 1, nil)
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	c.entry("bin/busybox", reg|0o755, 0, 0, bb)
	applets := "sh mount insmod cat echo ls tr sleep mkdir uname dd sync head od grep"
	for _, a := range strings.Fields(applets) {
		c.entry("bin/"+a, lnk|0o777, 0, 0, []byte("busybox"))
	}
	c.entry("init", reg|0o755, 0, 0, []byte(init))
	c.entry("modules.load", reg|0o644, 0, 0, []byte(modulesLoad))
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(files[n])
		if err != nil {
			return err
		}
		c.entry(n, reg|0o644, 0, 0, b)
	}
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	if err := c.w.Flush(); err != nil {
		return err
	}
	return f.Close()
}
