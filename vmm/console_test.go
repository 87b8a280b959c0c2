package vmm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConsoleFloodStaysUnderCap(t *testing.T) {
	path := filepath.Join(t.TempDir(), ConsoleLogName)
	if err := os.WriteFile(path, bytes.Repeat([]byte("old boot\n"), 20000), 0o600); err != nil {
		t.Fatal(err)
	}
	const capBytes = 64 << 10
	l, err := openCappedLog(path, capBytes)
	if err != nil {
		t.Fatal(err)
	}
	if l.size > capBytes {
		t.Fatalf("reopened oversize log kept %d bytes", l.size)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go pumpConsole(r, l, done)
	// A guest flooding its console: 16 MiB in writes of every size, one
	// larger than the cap.
	var last string
	for i, written := 0, 0; written < 16<<20; i++ {
		line := fmt.Sprintf("line %d %s\n", i, strings.Repeat("x", i%700))
		if i == 5000 {
			line = strings.Repeat("y", 3*capBytes) + "\n"
		}
		if _, err := w.WriteString(line); err != nil {
			t.Fatal(err)
		}
		written += len(line)
		last = line
		if i%1000 == 0 {
			if st, err := os.Stat(path); err != nil || st.Size() > capBytes {
				t.Fatalf("console log is %d bytes during the flood, cap %d (%v)", st.Size(), capBytes, err)
			}
		}
	}
	w.Close()
	<-done
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > capBytes || st.Size() < capBytes/4 {
		t.Errorf("console log is %d bytes after the flood, want at most the cap %d and its recent tail", st.Size(), capBytes)
	}
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), consoleTruncated) || !strings.HasSuffix(string(b), last) {
		t.Errorf("log does not start with the truncation mark and end with the newest line")
	}
	if got := ConsoleTail(path, 2000); len(got) > 2000 || !strings.HasSuffix(got, strings.TrimSpace(last)) {
		t.Errorf("ConsoleTail = %d bytes ending %q", len(got), got[max(0, len(got)-40):])
	}
}

func TestConsoleAppendsAcrossMachines(t *testing.T) {
	path := filepath.Join(t.TempDir(), ConsoleLogName)
	for _, s := range []string{"first boot\n", "restored\n"} {
		l, err := openCappedLog(path, DefaultConsoleMaxBytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	if b, _ := os.ReadFile(path); string(b) != "first boot\nrestored\n" {
		t.Errorf("console log %q", b)
	}
}
