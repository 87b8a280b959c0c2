package nodecache

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/bootid"
)

// A holder record says which process holds a base at which descriptor. It
// is a hint, never trusted: open checks the process and the descriptor.
type holderRecord struct {
	// Boot is the boot the record was written in: a record of an earlier
	// boot names a process that is gone, whatever now has its pid.
	Boot string `json:"boot"`
	PID  int    `json:"pid"`
	FD   int    `json:"fd"`
	// Start is the holder's start time (field 22 of /proc/<pid>/stat):
	// another process that got the pid since has another.
	Start uint64 `json:"start"`
	// Dev and Ino identify the memfd; Size is its size.
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
	Size int64  `json:"size"`
}

const (
	// recordLimit bounds what is read of a record.
	recordLimit = 4 << 10
	tempPrefix  = ".tmp-"
)

func isTemp(name string) bool { return strings.HasPrefix(name, tempPrefix) }

// name is the record's file name, <pid>-<fd>.
func (r holderRecord) name() string { return strconv.Itoa(r.PID) + "-" + strconv.Itoa(r.FD) }

// memfdName is the name a base's memfd is made with (readlink shows
// "/memfd:<name> (deleted)").
func memfdName(key string) string { return "cryo-base-" + key }

func procFD(pid, fd int) string { return "/proc/" + strconv.Itoa(pid) + "/fd/" + strconv.Itoa(fd) }

// parseRecord decodes the record in file name, refusing one whose fields
// are out of range or disagree with its name.
func parseRecord(name string, b []byte) (holderRecord, error) {
	var r holderRecord
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("record %s: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	switch {
	case r.PID <= 0:
		return r, fmt.Errorf("record %s: pid %d: %w", name, r.PID, errdefs.ErrInvalidArgument)
	case r.FD < 0:
		return r, fmt.Errorf("record %s: fd %d: %w", name, r.FD, errdefs.ErrInvalidArgument)
	case r.Size <= 0:
		return r, fmt.Errorf("record %s: size %d: %w", name, r.Size, errdefs.ErrInvalidArgument)
	case r.name() != name:
		return r, fmt.Errorf("record %s: names pid %d fd %d: %w", name, r.PID, r.FD, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// selfRecord describes this process's hold on the base at f.
func selfRecord(f *os.File, size int64) (holderRecord, error) {
	boot, err := bootid.Get()
	if err != nil {
		return holderRecord{}, err
	}
	start, _, err := processIdentity(os.Getpid())
	if err != nil {
		return holderRecord{}, err
	}
	id, err := fileID(f)
	if err != nil {
		return holderRecord{}, err
	}
	return holderRecord{Boot: boot, PID: os.Getpid(), FD: int(f.Fd()), Start: start, Dev: id.dev, Ino: id.ino, Size: size}, nil
}

// open reopens (read-only) the base the record names, if its holder is
// the live root process it names and the descriptor is the sealed memfd
// of key, of size bytes, that it names.
func (r holderRecord) open(key string, size int64) (*os.File, error) {
	boot, err := bootid.Get()
	if err != nil {
		return nil, err
	}
	if r.Boot != boot {
		return nil, fmt.Errorf("holder %d: written in boot %q", r.PID, r.Boot)
	}
	if r.Size != size {
		return nil, fmt.Errorf("holder %d: size %d, want %d", r.PID, r.Size, size)
	}
	if err := r.checkProcess(); err != nil {
		return nil, err
	}
	f, err := openMemfd(procFD(r.PID, r.FD), key, size, fileIdentity{r.Dev, r.Ino})
	if err != nil {
		return nil, fmt.Errorf("holder %d: %w", r.PID, err)
	}
	// The descriptor was the holder's if the holder still lives: a pid is
	// not reused while its process exists.
	if err := r.checkProcess(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// checkProcess checks that the holder is the process that wrote the
// record, and root: a QEMU (another uid) that got a dead shim's pid
// could hold a memfd of its own making at that number.
func (r holderRecord) checkProcess() error {
	start, uids, err := processIdentity(r.PID)
	if err != nil {
		return fmt.Errorf("holder %d: %w", r.PID, err)
	}
	if start != r.Start {
		return fmt.Errorf("holder %d: started at %d, the record says %d: another process", r.PID, start, r.Start)
	}
	if uids != "0 0 0 0" {
		return fmt.Errorf("holder %d: uids %s, not root", r.PID, uids)
	}
	return nil
}

// processIdentity reads a process's start time (field 22 of
// /proc/<pid>/stat) and its real, effective, saved and file-system uids.
func processIdentity(pid int) (start uint64, uids string, _ error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", err
	}
	// The command name (field 2) may hold spaces and parentheses: count
	// fields after its last ')', where field 3 is the first.
	i := bytes.LastIndexByte(stat, ')')
	fields := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(fields) < 22-2 {
		return 0, "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	if start, err = strconv.ParseUint(fields[22-3], 10, 64); err != nil {
		return 0, "", fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, "", err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
			return start, strings.Join(strings.Fields(rest), " "), nil
		}
	}
	return 0, "", fmt.Errorf("/proc/%d/status: no Uid line", pid)
}

type fileIdentity struct{ dev, ino uint64 }

func fileID(f *os.File) (fileIdentity, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileIdentity{}, fmt.Errorf("fstat %s: %w", f.Name(), err)
	}
	return fileIdentity{st.Dev, st.Ino}, nil
}

// openMemfd opens path (a /proc/<pid>/fd/<n> link) read-only if it is
// the base of key: the memfd id, of size bytes, with every seal. It is
// stat'ed before it is opened so that nothing but a regular file (no
// device, FIFO, socket) is ever opened.
func openMemfd(path, key string, size int64, id fileIdentity) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Dev != id.dev || st.Ino != id.ino {
		return nil, fmt.Errorf("%s: not the recorded file", path)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("reopen %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+memfdName(key))
	if err := checkMemfd(f, key, size, id); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// checkMemfd checks that f is the sealed memfd of key, id and size.
func checkMemfd(f *os.File, key string, size int64, id fileIdentity) error {
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Dev != id.dev || st.Ino != id.ino {
		return fmt.Errorf("not the recorded file")
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return err
	}
	link, err := os.Readlink(procFD(os.Getpid(), fd))
	if err != nil {
		return err
	}
	if sfs.Type != unix.TMPFS_MAGIC || link != "/memfd:"+memfdName(key)+" (deleted)" {
		return fmt.Errorf("%q: not a memfd of the base", link)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("seals: %w", err)
	}
	if seals&baseSeals != baseSeals {
		return fmt.Errorf("seals %#x, want %#x", seals, baseSeals)
	}
	if st.Size != size {
		return fmt.Errorf("size %d, want %d", st.Size, size)
	}
	return nil
}
