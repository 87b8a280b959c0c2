package nodecache

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// A child holder: the test binary re-executed with childEnv set to a
// childConfig shares a base as another shim of the node would, reports
// it on stdout, and holds it until its stdin closes.
const childEnv = "CRYO_NODECACHE_BASES_CHILD"

type childConfig struct {
	Dir    string        `json:"dir"`
	Store  string        `json:"store"`
	Digest digest.Digest `json:"digest"`
	Size   int64         `json:"size"`
	Fills  string        `json:"fills"` // a line is appended per fill
	Delay  time.Duration `json:"delay"` // how long a fill takes
	Tag    string        `json:"tag"`   // what a fill writes
}

type childReport struct {
	Err    string `json:"err,omitempty"`
	Reused bool   `json:"reused"`
	Dev    uint64 `json:"dev"`
	Ino    uint64 `json:"ino"`
	Head   string `json:"head"`
}

func TestMain(m *testing.M) {
	if cfg := os.Getenv(childEnv); cfg != "" {
		os.Exit(runChild(cfg))
	}
	os.Exit(m.Run())
}

func runChild(raw string) int {
	var cfg childConfig
	report := func(r childReport) { json.NewEncoder(os.Stdout).Encode(r) }
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		report(childReport{Err: err.Error()})
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base, err := OpenBases(cfg.Dir).Share(ctx, cfg.Store, cfg.Digest, cfg.Size, countingFill(cfg.Fills, cfg.Tag, cfg.Delay))
	if err != nil {
		report(childReport{Err: err.Error()})
		return 1
	}
	defer base.Close()
	id, _ := fileID(base.File())
	head := make([]byte, len(cfg.Tag))
	base.File().ReadAt(head, 0)
	report(childReport{Reused: base.Reused(), Dev: id.dev, Ino: id.ino, Head: string(head)})
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// countingFill writes tag at the start and the end of the base, taking
// delay, and appends a line to the file fills.
func countingFill(fills, tag string, delay time.Duration) func(*os.File) error {
	return func(f *os.File) error {
		l, err := os.OpenFile(fills, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		fmt.Fprintln(l, os.Getpid())
		l.Close()
		time.Sleep(delay)
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if _, err := f.WriteAt([]byte(tag), 0); err != nil {
			return err
		}
		_, err = f.WriteAt([]byte(tag), st.Size()-int64(len(tag)))
		return err
	}
}

// child is a running child holder.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	report chan childReport
}

// startChild starts a child holder; it is released (and reaped) at the
// end of the test at the latest.
func startChild(t *testing.T, cfg childConfig) *child {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, report: make(chan childReport, 1)}
	go func() {
		var r childReport
		line, err := bufio.NewReader(stdout).ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &r)
		}
		if err != nil {
			r.Err = fmt.Sprintf("no report: %v", err)
		}
		c.report <- r
	}()
	t.Cleanup(func() { c.release(t) })
	return c
}

// wait returns the child's report.
func (c *child) wait(t *testing.T) childReport {
	t.Helper()
	select {
	case r := <-c.report:
		if r.Err != "" {
			t.Fatalf("child %d: %s", c.cmd.Process.Pid, r.Err)
		}
		c.report <- r // for a later wait
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("child %d: no report in 30s", c.cmd.Process.Pid)
	}
	return childReport{}
}

// release lets the child close its base and exit, and reaps it.
func (c *child) release(t *testing.T) {
	if c.stdin == nil {
		return
	}
	c.stdin.Close()
	c.stdin = nil
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("child %d: %v", c.cmd.Process.Pid, err)
		}
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-done
		t.Errorf("child %d did not exit", c.cmd.Process.Pid)
	}
}
