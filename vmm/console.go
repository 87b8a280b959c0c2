package vmm

import (
	"errors"
	"io"
	"os"
)

// DefaultConsoleMaxBytes caps console.log when Config.ConsoleMaxBytes is 0.
const DefaultConsoleMaxBytes = 1 << 20

// consoleTruncated marks where a capped console log dropped older output.
const consoleTruncated = "\n[cryo: older console output dropped]\n"

// cappedLog is a file that never grows beyond max bytes: a guest writes its
// console at will, so when a write would pass the cap, the older half of
// the file is dropped and the newest output kept (amortized: each byte is
// copied at most about once more).
type cappedLog struct {
	f    *os.File
	size int64
	max  int64
}

// openCappedLog opens path for appending, keeping what a previous machine
// of the sandbox wrote (a restored guest continues the same console).
func openCappedLog(path string, max int64) (*cappedLog, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	l := &cappedLog{f: f, size: st.Size(), max: max}
	if l.size > max {
		if err := l.keepTail(max / 2); err != nil {
			f.Close()
			return nil, err
		}
	}
	return l, nil
}

func (l *cappedLog) Write(p []byte) (int, error) {
	n := len(p)
	if int64(len(p)) > l.max/2 {
		p = p[int64(len(p))-l.max/2:]
	}
	if l.size+int64(len(p)) > l.max {
		if err := l.keepTail(l.max/2 - int64(len(p))); err != nil {
			return 0, err
		}
	}
	w, err := l.f.WriteAt(p, l.size)
	l.size += int64(w)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// keepTail rewrites the file as a marker and its last keep bytes.
func (l *cappedLog) keepTail(keep int64) error {
	keep = max(0, min(keep-int64(len(consoleTruncated)), l.size))
	b := make([]byte, keep)
	if _, err := l.f.ReadAt(b, l.size-keep); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	b = append([]byte(consoleTruncated), b...)
	if _, err := l.f.WriteAt(b, 0); err != nil {
		return err
	}
	if err := l.f.Truncate(int64(len(b))); err != nil {
		return err
	}
	l.size = int64(len(b))
	return nil
}

func (l *cappedLog) Close() error { return l.f.Close() }

// pumpConsole copies the guest console from r (QEMU's end of a pipe) into
// a capped log until QEMU closes it. done is closed at the end.
func pumpConsole(r *os.File, l *cappedLog, done chan<- struct{}) {
	defer close(done)
	defer r.Close()
	defer l.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := l.Write(buf[:n]); werr != nil {
				io.Copy(io.Discard, r) // keep the guest from blocking on a full pipe
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// ConsoleTail returns the last max bytes (at most) of a console log,
// without reading the rest of it.
func ConsoleTail(path string, max int64) string {
	return tail(path, max)
}
