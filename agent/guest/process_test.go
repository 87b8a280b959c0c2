package guest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

func TestProcessBookkeeping(t *testing.T) {
	p := newProcess("e1", &helperConfig{}, StdioConfig{})
	if err := p.Signal(unix.SIGTERM); !errdefs.IsNotFound(err) {
		t.Errorf("signal before spawn: %v, want not found", err)
	}
	if _, err := p.WriteStdin([]byte("x")); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("stdin without a pipe: %v", err)
	}
	if err := p.Resize(80, 24); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("resize without a terminal: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := p.Wait(ctx); err != context.DeadlineExceeded {
		t.Errorf("wait on a live process: %v", err)
	}
	p.pid = 12345
	p.setExited(Exit{Status: 3, At: time.Unix(1, 0)})
	e, err := p.Wait(context.Background())
	if err != nil || e.Status != 3 {
		t.Errorf("wait after exit: %+v %v", e, err)
	}
	if err := p.Signal(unix.SIGTERM); !errdefs.IsNotFound(err) {
		t.Errorf("signal after exit: %v, want not found (the pid may be reused)", err)
	}
}

func TestValidID(t *testing.T) {
	for _, id := range []string{"", ".", "..", "a/b", "x\x00"} {
		if validID(id) == nil {
			t.Errorf("%q accepted", id)
		}
	}
	if err := validID("abc-123_x.y"); err != nil {
		t.Error(err)
	}
}

func TestFindDisk(t *testing.T) {
	sys, dev := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(sys, "vda"), 0o755)
	os.MkdirAll(filepath.Join(sys, "vdb"), 0o755)
	os.WriteFile(filepath.Join(sys, "vda", "serial"), []byte("boot\n"), 0o644)
	os.WriteFile(filepath.Join(dev, "vda"), nil, 0o644)
	go func() { // a disk that is hot-plugged a little later, its node later still
		time.Sleep(50 * time.Millisecond)
		os.WriteFile(filepath.Join(sys, "vdb", "serial"), []byte("rootfs0"), 0o644)
		time.Sleep(100 * time.Millisecond)
		os.WriteFile(filepath.Join(dev, "vdb"), nil, 0o644)
	}()
	start := time.Now()
	got, err := findDisk(context.Background(), sys, dev, "rootfs0", 5*time.Second)
	if err != nil || got != filepath.Join(dev, "vdb") {
		t.Fatalf("findDisk = %q, %v", got, err)
	}
	if time.Since(start) < 150*time.Millisecond {
		t.Errorf("findDisk returned after %v, before the device node opened", time.Since(start))
	}
	if _, err := findDisk(context.Background(), sys, dev, "nope", 30*time.Millisecond); !errdefs.IsNotFound(err) {
		t.Fatalf("missing disk: %v", err)
	}
	os.MkdirAll(filepath.Join(sys, "vdc"), 0o755)
	os.WriteFile(filepath.Join(sys, "vdc", "serial"), []byte("nonode"), 0o644)
	if _, err := findDisk(context.Background(), sys, dev, "nonode", 60*time.Millisecond); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("a disk whose node never opens: %v", err)
	}
}

func TestReadUptime(t *testing.T) {
	f := filepath.Join(t.TempDir(), "uptime")
	os.WriteFile(f, []byte("12.50 30.00\n"), 0o644)
	d, err := readUptime(f)
	if err != nil || d != 12500*time.Millisecond {
		t.Fatalf("uptime %v %v", d, err)
	}
}

func TestFindPort(t *testing.T) {
	sys := t.TempDir()
	for name, port := range map[string]string{"vport0p1": "org.qemu.guest_agent.0", "vport0p2": PortName} {
		os.MkdirAll(filepath.Join(sys, name), 0o755)
		os.WriteFile(filepath.Join(sys, name, "name"), []byte(port+"\n"), 0o644)
	}
	dev, err := FindPort(context.Background(), sys, PortName, time.Second)
	if err != nil || dev != "/dev/vport0p2" {
		t.Fatalf("FindPort = %q, %v", dev, err)
	}
}

func TestHomeDir(t *testing.T) {
	f := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(f, []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\nbad\n"), 0o644)
	for uid, want := range map[uint32]string{0: "/root", 1000: "/home/app", 42: "/"} {
		if got := homeDir(f, uid); got != want {
			t.Errorf("uid %d: %q, want %q", uid, got, want)
		}
	}
	if got := homeDir(filepath.Join(t.TempDir(), "none"), 0); got != "/" {
		t.Errorf("no passwd: %q", got)
	}
}

// TestCheckStartable: a process that cannot start (no such executable, a
// directory, a working directory that is a file) is refused before the
// container is reported ready, as runc fails the create.
func TestCheckStartable(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	pathEnv := []string{"PATH=" + dir}
	for _, c := range []struct {
		args []string
		cwd  string
		ok   bool
	}{
		{[]string{bin}, dir, true},
		{[]string{"app"}, "/", true},
		{[]string{"./app"}, dir, true},
		{[]string{"nope"}, "/", false},
		{[]string{filepath.Join(dir, "nope")}, "/", false},
		{[]string{dir}, "/", false},
		{[]string{bin}, file, false},
		{[]string{bin}, filepath.Join(dir, "missing"), false},
	} {
		err := checkStartable(&processConfig{Args: c.args, Cwd: c.cwd, Env: pathEnv})
		if (err == nil) != c.ok {
			t.Errorf("args %q in %s: %v, want ok %v", c.args, c.cwd, err, c.ok)
		}
	}
}
