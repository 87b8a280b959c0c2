package vmm

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHelperProcess is not a test: started by fakeProcess, it sleeps until killed.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("CRYO_VMM_SLEEP") != "1" {
		return
	}
	time.Sleep(time.Minute)
	os.Exit(0)
}

// fakeProcess starts the test binary under the program name argv0 with
// extra arguments, as a stand-in for a QEMU process. It is reaped (and
// killed, if still running) at the end of the test.
func fakeProcess(t *testing.T, argv0 string, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Args = append([]string{argv0, "-test.run=^TestHelperProcess$", "--"}, extra...)
	cmd.Env = append(os.Environ(), "CRYO_VMM_SLEEP=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	// Wait for the exec to show the new cmdline.
	for i := 0; i < 200; i++ {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline"); strings.HasPrefix(string(b), argv0) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cmd
}

// writeState lays out the files a started machine leaves in dir.
func writeState(t *testing.T, dir string, pid int, mem string, owns bool) {
	t.Helper()
	mode := MemoryOwned
	if !owns {
		mode = MemoryServed // the caller's file
	}
	m := &Machine{cfg: Config{ID: "sb", StateDir: dir, Memory: Memory{Mode: mode, Path: mem}}}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := m.writeRecords(pid); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{QMPSocketName, AgentSocketName, QEMULogName} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	if mem != "" {
		os.WriteFile(mem, []byte("ram"), 0o600)
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

func TestCleanupKillsOnlyOurQEMU(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sb")
	mem := filepath.Join(t.TempDir(), "sb.ram")
	qmpArg := "socket,id=qmp,server=on,wait=off,path=" + filepath.Join(dir, QMPSocketName)

	// A QEMU of another sandbox, and a non-QEMU process with our argument.
	otherQEMU := fakeProcess(t, "/usr/bin/qemu-system-x86_64", "-chardev", "socket,id=qmp,server=on,wait=off,path=/elsewhere/qmp.sock")
	notQEMU := fakeProcess(t, "/usr/bin/sleeper", "-chardev", qmpArg)
	for _, p := range []*exec.Cmd{otherQEMU, notQEMU} {
		writeState(t, dir, p.Process.Pid, mem, true)
		if err := Cleanup(dir); err != nil {
			t.Fatal(err)
		}
		if !alive(p.Process.Pid) {
			t.Fatalf("Cleanup killed %v", p.Args)
		}
	}

	ours := fakeProcess(t, "/usr/bin/qemu-system-x86_64", "-name", "guest=sb", "-chardev", qmpArg)
	writeState(t, dir, ours.Process.Pid, mem, true)
	if err := Cleanup(dir); err != nil {
		t.Fatal(err)
	}
	if alive(ours.Process.Pid) {
		t.Error("Cleanup left our qemu alive")
	}
	for _, n := range []string{QMPSocketName, AgentSocketName, PidFileName, metaFileName} {
		if exists(filepath.Join(dir, n)) {
			t.Errorf("%s left behind", n)
		}
	}
	if exists(mem) {
		t.Error("owned ram file left behind")
	}
	if !exists(filepath.Join(dir, QEMULogName)) {
		t.Error("Cleanup removed the qemu log")
	}
}

func TestCleanupKeepsForeignRAMFile(t *testing.T) {
	dir := t.TempDir()
	mem := filepath.Join(t.TempDir(), "materialized.ram")
	writeState(t, dir, 999999999, mem, false) // restore: RAM file belongs to the cache
	if err := Cleanup(dir); err != nil {
		t.Fatal(err)
	}
	if !exists(mem) {
		t.Error("Cleanup removed a RAM file the machine did not own")
	}
	if err := Cleanup(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("Cleanup of a missing dir: %v", err)
	}
	os.WriteFile(filepath.Join(dir, PidFileName), []byte("garbage"), 0o600)
	if err := Cleanup(dir); err == nil {
		t.Error("Cleanup accepted a garbage pid file")
	}
}

func TestTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := 0; i < 500; i++ {
		b.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	os.WriteFile(p, []byte(b.String()), 0o600)
	got := tail(p, 100)
	if !strings.HasSuffix(got, "line 499") || !strings.HasPrefix(got, "line ") || len(got) > 100 {
		t.Errorf("tail = %q", got)
	}
	if tail(filepath.Join(t.TempDir(), "none"), 100) != "" {
		t.Error("tail of a missing file is not empty")
	}
}
