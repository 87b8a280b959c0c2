//go:build integration

package vmm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// assertNoLeftovers fails if the machine's process or files remain.
func assertNoLeftovers(t *testing.T, cfg Config, pid int) {
	t.Helper()
	if pid != 0 && alive(pid) {
		t.Errorf("qemu %d is still alive", pid)
	}
	for _, n := range []string{QMPSocketName, AgentSocketName, PidFileName, metaFileName} {
		if _, err := os.Stat(filepath.Join(cfg.StateDir, n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left behind (%v)", n, err)
		}
	}
	if cfg.Memory.owned() {
		if _, err := os.Stat(cfg.Memory.Path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ram file %s left behind (%v)", cfg.Memory.Path, err)
		}
	}
}

func TestShutdownLeavesNothing(t *testing.T) {
	cfg := testConfig(t, "shut")
	m := startVM(t, cfg)
	pid := m.Pid()
	if pid == 0 || !alive(pid) {
		t.Fatalf("pid %d not running", pid)
	}
	b, _ := os.ReadFile(filepath.Join(cfg.StateDir, PidFileName))
	if strings.TrimSpace(string(b)) == "" || !isOurQEMU(pid, cfg.StateDir, m.Args()) {
		t.Errorf("pid file %q / cmdline check failed for %d", b, pid)
	}
	if st, err := os.Stat(cfg.Memory.Path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("ram file: %v %v (want mode 0600)", st, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Many waiters, one shutdown.
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.Wait(ctx); err != nil {
				t.Errorf("Wait: %v", err)
			}
		}()
	}
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	wg.Wait()
	assertNoLeftovers(t, cfg, pid)
	if err := m.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	if err := m.Pause(ctx); err == nil {
		t.Error("Pause after Shutdown succeeded")
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, QEMULogName)); err != nil {
		t.Errorf("qemu.log should stay for diagnosis: %v", err)
	}
}

func TestCleanupKillsRecordedQEMU(t *testing.T) {
	cfg := testConfig(t, "clean")
	m := startVM(t, cfg)
	pid := m.Pid()
	// Another state directory's cleanup must not touch this QEMU.
	if err := Cleanup(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, PidFileName), []byte(strconv.Itoa(pid)), 0o600)
	if err := Cleanup(other); err != nil {
		t.Fatal(err)
	}
	if !alive(pid) {
		t.Fatal("Cleanup of another state dir killed this qemu")
	}
	if err := Cleanup(cfg.StateDir); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Wait(ctx); err == nil || ctx.Err() != nil {
		t.Errorf("Wait after an external kill = %v, want an exit error", err)
	}
	assertNoLeftovers(t, cfg, pid)
}

func TestStartFailuresAreClearAndClean(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	script := func(body string) string {
		dir := t.TempDir()
		p := filepath.Join(dir, "fake-qemu")
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{dir, filepath.Dir(dir)} { // the confined uid runs it
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	cases := []struct {
		name   string
		mutate func(*Config)
		before func(Config) // after New, before Start
		start  time.Duration
		want   string
	}{
		{
			name:   "kernel removed before start",
			mutate: func(c *Config) { c.Kernel = copyFile(t, c.Kernel) },
			before: func(c Config) { os.Remove(c.Kernel) },
			want:   "vmlinuz: no such file or directory",
		},
		{
			name:   "unknown machine version",
			mutate: func(c *Config) { c.MachineType = "pc-q35-1.99" },
			want:   "unsupported machine type",
		},
		{
			name:   "qemu binary missing",
			mutate: func(c *Config) { c.QEMUPath = "/nonexistent/qemu-system-x86_64" },
			want:   "no such file or directory",
		},
		{
			name:   "qemu fails at once",
			mutate: func(c *Config) { c.QEMUPath = script("echo 'boom: bad qemu' >&2; exit 1") },
			want:   "boom: bad qemu",
		},
		{
			name:   "qemu never opens qmp",
			mutate: func(c *Config) { c.QEMUPath = script("echo hanging >&2; exec sleep 600") },
			start:  time.Second,
			want:   "hanging",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "fail")
			tc.mutate(&cfg)
			m, err := New(cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if tc.before != nil {
				tc.before(cfg)
			}
			sctx := ctx
			if tc.start > 0 {
				var c context.CancelFunc
				sctx, c = context.WithTimeout(ctx, tc.start)
				defer c()
			}
			err = m.Start(sctx)
			if err == nil {
				m.Shutdown(ctx)
				t.Fatal("Start succeeded")
			}
			t.Logf("Start error: %v", err)
			if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			assertNoLeftovers(t, cfg, m.Pid())
			select {
			case <-m.Exited():
			default:
				t.Error("Exited not closed after a failed Start")
			}
			if err := m.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown after failed Start: %v", err)
			}
		})
	}
}

func copyFile(t *testing.T, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// helperEnv makes the test binary a process that starts the machine whose
// JSON config is the variable's value, prints QEMU's pid and waits to be
// killed.
const helperEnv = "CRYO_VMM_TEST_HELPER"

func runHelper() {
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	m, err := New(cfg)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = m.Start(ctx)
		cancel()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(m.Pid())
	select {}
}

func TestQEMUDiesWithItsParent(t *testing.T) {
	cfg := testConfig(t, "orphan")
	b, _ := json.Marshal(cfg)
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperEnv+"="+string(b))
	helper.Stderr = os.Stderr
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait(); Cleanup(cfg.StateDir) })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || !alive(pid) {
		t.Fatalf("helper printed %q; qemu alive: %v", line, err == nil && alive(pid))
	}
	// Let the helper's runtime start more threads, then kill it outright.
	time.Sleep(500 * time.Millisecond)
	helper.Process.Signal(syscall.SIGKILL)
	helper.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("qemu %d outlived its SIGKILLed parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The shim's delete path: files only.
	if err := Cleanup(cfg.StateDir); err != nil {
		t.Fatal(err)
	}
	assertNoLeftovers(t, cfg, 0)
}

func TestShutdownDuringStart(t *testing.T) {
	cfg := testConfig(t, "racy")
	p := filepath.Join(t.TempDir(), "slow-qemu")
	os.WriteFile(p, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755)
	cfg.QEMUPath = p
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- m.Start(context.Background()) }()
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Shutdown of a starting machine took %v", d)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Start succeeded after Shutdown")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return after Shutdown")
	}
	assertNoLeftovers(t, cfg, m.Pid())
}
