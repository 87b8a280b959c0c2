package vmm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cryo-runtime/cryo/internal/sparse"
)

// record is what the state directory keeps for Cleanup besides qemu.pid.
type record struct {
	ID         string `json:"id"`
	Pid        int    `json:"pid"`
	MemoryPath string `json:"memory_path"`
	OwnsMemory bool   `json:"owns_memory"` // Cleanup removes MemoryPath
	// PrivateMemory is a confined restore's copy of the RAM file.
	PrivateMemory string `json:"private_memory,omitempty"`
	// Args is QEMU's argv (without argv[0]): Cleanup kills only a process
	// whose command line is exactly this.
	Args []string `json:"args,omitempty"`
}

// prepareFiles creates the state directory, removes stale sockets and, for
// an owned RAM file, creates it 0600 (QEMU would create it world-readable,
// and guest RAM holds the guest's secrets) and owned by QEMU's uid (uid < 0:
// root). A confined restore gets a private copy of the RAM file.
func (m *Machine) prepareFiles(uid int) error {
	if err := os.MkdirAll(m.cfg.StateDir, 0o700); err != nil {
		return err
	}
	for _, n := range []string{QMPSocketName, AgentSocketName, PidFileName} {
		if err := os.Remove(m.path(n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if priv, ok := m.cfg.privateMemory(); ok {
		start := time.Now()
		if err := os.Remove(priv); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := sparse.Copy(priv, m.cfg.Memory.Path, uid); err != nil {
			return fmt.Errorf("private copy of ram file: %w", err)
		}
		log.L.WithFields(log.Fields{"id": m.cfg.ID, "duration": time.Since(start)}).Debug("ram file copied for a confined qemu")
		return nil
	}
	if !m.cfg.Memory.owned() {
		if _, err := os.Stat(m.cfg.Memory.Path); err != nil {
			return fmt.Errorf("ram file: %w", err)
		}
		return nil
	}
	// A leftover file of this sandbox would hand the new guest stale RAM.
	if err := os.Remove(m.cfg.Memory.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale ram file: %w", err)
	}
	f, err := os.OpenFile(m.cfg.Memory.Path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create ram file: %w", err)
	}
	defer f.Close()
	if uid >= 0 {
		if err := f.Chown(uid, uid); err != nil {
			return fmt.Errorf("ram file: %w", err)
		}
	}
	return nil
}

// disownFiles gives the RAM files that QEMU's uid owned back to root before
// the uid is freed: the next QEMU of that uid must not be able to open them,
// nor a hard link the caller made to keep the RAM (checkpoint, then stop).
func (m *Machine) disownFiles() {
	for _, p := range m.uidFiles() {
		if err := os.Lchown(p, 0, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.L.WithError(err).WithField("id", m.cfg.ID).Warn("give qemu's ram file back to root")
		}
	}
}

// uidFiles are the files prepareFiles gives QEMU's uid: the ones
// disownFiles gives back.
func (m *Machine) uidFiles() []string {
	if priv, ok := m.cfg.privateMemory(); ok {
		return []string{priv}
	}
	if m.cfg.Memory.owned() {
		return []string{m.cfg.Memory.Path}
	}
	return nil
}

// ramFile is the RAM file QEMU maps.
func (m *Machine) ramFile() string {
	if p, ok := m.cfg.privateMemory(); ok {
		return p
	}
	return m.cfg.Memory.Path
}

// writeRecords writes qemu.pid and vmm.json.
func (m *Machine) writeRecords(pid int) error {
	priv, _ := m.cfg.privateMemory()
	b, _ := json.Marshal(record{ID: m.cfg.ID, Pid: pid, MemoryPath: m.cfg.Memory.Path, OwnsMemory: m.cfg.Memory.owned(), PrivateMemory: priv, Args: m.args})
	if err := writeFileAtomic(m.path(metaFileName), b); err != nil {
		return err
	}
	return writeFileAtomic(m.path(PidFileName), []byte(strconv.Itoa(pid)))
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// removeFiles removes what the machine made in its state directory (logs
// stay) and an owned RAM file.
func (m *Machine) removeFiles() error {
	priv, _ := m.cfg.privateMemory()
	return removeStateFiles(m.cfg.StateDir, m.cfg.Memory.Path, m.cfg.Memory.owned(), priv)
}

func removeStateFiles(dir, memPath string, ownsMemory bool, private string) error {
	var errs []error
	names := []string{QMPSocketName, AgentSocketName, PidFileName, metaFileName}
	for _, n := range names {
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if !ownsMemory {
		memPath = ""
	}
	for _, p := range []string{memPath, private} {
		if p == "" {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Stderr returns the last lines (at most 2 KiB) of QEMU's output.
func (m *Machine) Stderr() string { return tail(m.path(QEMULogName), 2048) }

func tail(path string, max int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - max
	if off < 0 {
		off = 0
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, off, max))
	if off > 0 {
		// Drop the cut line, unless it is all there is (a guest may write
		// one endless line).
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(bytes.TrimRight(b, "\r\n")) {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}

func stderrSuffix(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// AgentSocketPath is the unix socket of the virtio-serial port "agent.0".
func (m *Machine) AgentSocketPath() string { return m.path(AgentSocketName) }

// ConsolePath is the file receiving the guest's serial console.
func (m *Machine) ConsolePath() string { return m.path(ConsoleLogName) }

// DialAgent connects to the agent port's socket, retrying until ctx ends.
// QEMU accepts one connection at a time on it; the guest sees the host
// connect and disconnect.
func (m *Machine) DialAgent(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", m.AgentSocketPath())
		if err == nil {
			return c, nil
		}
		select {
		case <-m.exited:
			return nil, fmt.Errorf("dial agent of vm %s: qemu exited", m.cfg.ID)
		case <-ctx.Done():
			return nil, fmt.Errorf("dial agent of vm %s: %w (last error: %v)", m.cfg.ID, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Cleanup removes what a machine left in stateDir, from the files alone (for
// `shim delete` after a crash): it kills the QEMU recorded in qemu.pid after
// checking, through /proc/<pid>/cmdline, that the process is a QEMU serving
// this state directory, waits for it to die, then removes the sockets, the
// pid file and an owned RAM file. Logs stay. A missing or empty stateDir is
// not an error.
func Cleanup(stateDir string) error {
	var rec record
	if b, err := os.ReadFile(filepath.Join(stateDir, metaFileName)); err == nil {
		if err := json.Unmarshal(b, &rec); err != nil {
			return fmt.Errorf("cleanup %s: %w: %v", stateDir, errdefs.ErrDataLoss, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(stateDir, PidFileName)); err == nil {
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			return fmt.Errorf("cleanup %s: bad pid file %q", stateDir, b)
		}
		if err := killQEMU(pid, stateDir, rec.Args); err != nil {
			return fmt.Errorf("cleanup %s: %w", stateDir, err)
		}
	}
	if err := removeStateFiles(stateDir, rec.MemoryPath, rec.OwnsMemory, rec.PrivateMemory); err != nil {
		return fmt.Errorf("cleanup %s: %w", stateDir, err)
	}
	return nil
}

// killQEMU kills pid if it is a QEMU of stateDir (with args, when known)
// and waits until it is gone.
func killQEMU(pid int, stateDir string, args []string) error {
	// os.FindProcess holds a pidfd: once it is open, the checks below and the
	// signal concern the same process even if the pid is reused meanwhile.
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	defer p.Release()
	if !isOurQEMU(pid, stateDir, args) {
		return nil // gone, or the pid now belongs to someone else
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return fmt.Errorf("kill qemu %d: %w", pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("qemu %d still alive after SIGKILL", pid)
}

// isOurQEMU reports whether /proc/<pid>/cmdline is a qemu program with
// argv args, or, for a record without them (written by an older shim),
// whose QMP socket is in stateDir.
func isOurQEMU(pid int, stateDir string, args []string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if !strings.Contains(filepath.Base(argv[0]), "qemu") {
		return false
	}
	if len(args) > 0 {
		return slices.Equal(argv[1:], args)
	}
	want := "path=" + optEscape(filepath.Join(stateDir, QMPSocketName))
	for _, a := range argv[1:] {
		if strings.HasPrefix(a, "socket,id=qmp,") && strings.HasSuffix(a, want) {
			return true
		}
	}
	return false
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
