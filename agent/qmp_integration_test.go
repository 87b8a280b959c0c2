//go:build integration

package agent_test

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// qmpConn is just enough QMP for the tests: commands, replies, fd passing.
type qmpConn struct {
	c *net.UnixConn
	r *bufio.Reader
}

func dialQMP(t *testing.T, path string) *qmpConn {
	t.Helper()
	// QEMU binds the socket before it listens: the file can exist while a
	// dial is still refused, for a moment.
	var c *net.UnixConn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if c, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial qmp: %v", err)
		}
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	q := &qmpConn{c: c, r: bufio.NewReader(c)}
	if _, err := q.r.ReadBytes('\n'); err != nil { // greeting
		t.Fatalf("qmp greeting: %v", err)
	}
	q.run(t, `{"execute":"qmp_capabilities"}`, nil)
	return q
}

// run sends cmd (with f as SCM_RIGHTS when set) and returns the "return" value.
func (q *qmpConn) run(t *testing.T, cmd string, f *os.File) json.RawMessage {
	t.Helper()
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	if _, _, err := q.c.WriteMsgUnix([]byte(cmd), oob, nil); err != nil {
		t.Fatalf("qmp %s: %v", cmd, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("qmp %s: %v", cmd, err)
		}
		var m struct {
			Event  string          `json:"event"`
			Return json.RawMessage `json:"return"`
			Error  *struct{ Desc string }
		}
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("qmp reply %q: %v", line, err)
		}
		switch {
		case m.Event != "":
			continue
		case m.Error != nil:
			t.Fatalf("qmp %s: %s", cmd, m.Error.Desc)
		}
		return m.Return
	}
}

// checkpoint stops the VM and saves its state into path, then quits QEMU.
func (vm *testVM) checkpoint(t *testing.T, path string) {
	t.Helper()
	q := dialQMP(t, vm.qmp)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q.run(t, `{"execute":"stop"}`, nil)
	q.run(t, `{"execute":"getfd","arguments":{"fdname":"mig"}}`, f)
	q.run(t, `{"execute":"migrate","arguments":{"uri":"fd:mig"}}`, nil)
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var st struct{ Status string }
		json.Unmarshal(q.run(t, `{"execute":"query-migrate"}`, nil), &st)
		if st.Status == "completed" {
			break
		}
		if st.Status == "failed" || st.Status == "cancelled" || time.Now().After(deadline) {
			t.Fatalf("migration %s", st.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	q.run(t, `{"execute":"quit"}`, nil)
	select {
	case err := <-vm.exited:
		vm.exited <- err
	case <-time.After(30 * time.Second):
		t.Fatal("qemu did not quit")
	}
}

// restore starts a new QEMU with the same devices from a saved state.
func (vm *testVM) restore(t *testing.T, path, name string) *testVM {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	t.Logf("device and RAM state: %d MiB", fi.Size()>>20)
	nvm := launch(t, vm.dir, name, vm.args, f)
	// The source was stopped, so the loaded VM stays paused until cont.
	q := dialQMP(t, nvm.qmp)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		var st struct{ Status string }
		json.Unmarshal(q.run(t, `{"execute":"query-status"}`, nil), &st)
		if st.Status == "paused" || st.Status == "postmigrate" || st.Status == "running" {
			break
		}
		if st.Status != "inmigrate" || time.Now().After(deadline) {
			t.Fatalf("restored vm is %s", st.Status)
		}
	}
	q.run(t, `{"execute":"cont"}`, nil)
	return nvm
}
