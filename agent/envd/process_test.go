package envd

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	rpc "github.com/cryo-runtime/cryo/agent/envd/spec/process"
	"github.com/cryo-runtime/cryo/agent/envd/spec/process/processconnect"
)

// dirContainer is a test double of the sandbox's container: its root is a
// directory of the host and Spawn starts host processes (os/exec) in the
// command's directory under that root. It records what it was asked to
// run, credentials included, which it does not apply.
var spawned sync.Map // root -> []Command

func (d dirContainer) Process() ProcessSpec {
	return ProcessSpec{UID: 0, GID: 0, Groups: []uint32{10}, Env: []string{"PATH=" + os.Getenv("PATH"), "FROM_IMAGE=yes", "HOME=/image-home"}}
}

func (d dirContainer) Spawn(ctx context.Context, c Command) (Process, error) {
	prev, _ := spawned.Load(string(d))
	cmds, _ := prev.([]Command)
	spawned.Store(string(d), append(cmds, c))
	cmd := exec.Command(c.Args[0], c.Args[1:]...)
	cmd.Env = c.Env
	cmd.Dir = filepath.Join(string(d), c.Dir)
	p := &hostProcess{exited: make(chan struct{})}
	var child []*os.File
	defer func() {
		for _, f := range child {
			f.Close()
		}
	}()
	if c.PTY != nil {
		master, slave, err := hostPty()
		if err != nil {
			return nil, err
		}
		child = append(child, slave)
		if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: c.PTY.Cols, Row: c.PTY.Rows}); err != nil {
			return nil, err
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
		p.pty, p.stdout, p.stdin = master, master, master
	} else {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		child = append(child, w)
		cmd.Stdout, p.stdout = w, r
		if r, w, err = os.Pipe(); err != nil {
			return nil, err
		}
		child = append(child, w)
		cmd.Stderr, p.stderr = w, r
		if c.Stdin {
			if r, w, err = os.Pipe(); err != nil {
				return nil, err
			}
			child = append(child, r)
			cmd.Stdin, p.stdin = r, w
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p.cmd = cmd
	go func() {
		cmd.Wait()
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			p.exit.Signal = ws.Signal()
		} else {
			p.exit.Code = ws.ExitStatus()
		}
		close(p.exited)
	}()
	return p, nil
}

// hostPty opens a terminal pair, the slave through the master.
func hostPty() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, err
	}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, m.Fd(), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		m.Close()
		return nil, nil, errno
	}
	return m, os.NewFile(fd, "pty-slave"), nil
}

type hostProcess struct {
	cmd            *exec.Cmd
	stdin          *os.File
	stdout, stderr *os.File
	pty            *os.File
	exit           Exit
	exited         chan struct{}
}

func (p *hostProcess) Pid() uint32 { return uint32(p.cmd.Process.Pid) }
func (p *hostProcess) Stdin() io.WriteCloser {
	if p.stdin == nil {
		return nil
	}
	return p.stdin
}
func (p *hostProcess) Stdout() io.Reader { return p.stdout }
func (p *hostProcess) Stderr() io.Reader {
	if p.stderr == nil {
		return nil
	}
	return p.stderr
}
func (p *hostProcess) Wait() Exit                      { <-p.exited; return p.exit }
func (p *hostProcess) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }
func (p *hostProcess) Resize(s WindowSize) error {
	return unix.IoctlSetWinsize(int(p.pty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: s.Cols, Row: s.Rows})
}
func (p *hostProcess) Release() {
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

const testToken = "secret"

// newProcessTest serves envd over a fake container whose /etc/passwd has
// root and user, and returns it with a client of its process service.
func newProcessTest(t *testing.T, opts ...connect.ClientOption) (*Server, processconnect.ProcessClient, dirContainer) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"etc", "root", "home/user", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nuser:x:1000:\nwheel:x:10:user\n"), 0o644)
	c := dirContainer(root)
	s := New(c, sha256.Sum256([]byte(testToken)))
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		// kill what a failed test left running
		s.processes.mu.Lock()
		for _, p := range s.processes.procs {
			p.handle.Signal(unix.SIGKILL)
		}
		s.processes.mu.Unlock()
		ts.Close()
	})
	return s, processconnect.NewProcessClient(ts.Client(), ts.URL, opts...), c
}

func withToken[T any](m *T, user string) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set("X-Access-Token", testToken)
	if user != "" {
		r.Header().Set("Authorization", "Basic "+basic(user))
	}
	return r
}

func basic(user string) string {
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(user, "")
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

// result collects a stream's events.
type result struct {
	pid            uint32
	stdout, stderr string
	pty            string
	keepalives     int
	end            *rpc.ProcessEvent_EndEvent
}

type eventStream interface {
	Receive() bool
	Err() error
}

// collect reads a Start or Connect stream to its end; until, when set,
// stops it early once it returns true.
func collect[T interface{ GetEvent() *rpc.ProcessEvent }](t *testing.T, s interface {
	eventStream
	Msg() T
}, until func(*result) bool) *result {
	t.Helper()
	r := &result{}
	for s.Receive() {
		switch ev := s.Msg().GetEvent().GetEvent().(type) {
		case *rpc.ProcessEvent_Start:
			r.pid = ev.Start.GetPid()
		case *rpc.ProcessEvent_Data:
			r.stdout += string(ev.Data.GetStdout())
			r.stderr += string(ev.Data.GetStderr())
			r.pty += string(ev.Data.GetPty())
		case *rpc.ProcessEvent_Keepalive:
			r.keepalives++
		case *rpc.ProcessEvent_End:
			r.end = ev.End
		}
		if until != nil && until(r) {
			return r
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return r
}

func start(cmd string, args ...string) *rpc.StartRequest {
	return &rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: cmd, Args: args}}
}

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}

// TestProcessRun: stdout, stderr and a non-zero exit come back as E2B's
// envd reports them, with both codecs the SDK may use.
func TestProcessRun(t *testing.T) {
	for name, opts := range map[string][]connect.ClientOption{"proto": nil, "json": {connect.WithProtoJSON()}} {
		t.Run(name, func(t *testing.T) {
			_, client, _ := newProcessTest(t, opts...)
			st, err := client.Start(context.Background(), withToken(start("sh", "-c", "echo out; echo err >&2; exit 3"), ""))
			if err != nil {
				t.Fatal(err)
			}
			r := collect(t, st, nil)
			if r.pid == 0 || r.stdout != "out\n" || r.stderr != "err\n" || r.end == nil {
				t.Fatalf("got %+v", r)
			}
			if e := r.end; e.ExitCode != 3 || !e.Exited || e.Status != "exit status 3" || e.GetError() != "exit status 3" {
				t.Fatalf("end = %v, want exit status 3", e)
			}
			st, err = client.Start(context.Background(), withToken(start("true"), ""))
			if err != nil {
				t.Fatal(err)
			}
			if r := collect(t, st, nil); r.end == nil || r.end.ExitCode != 0 || r.end.Error != nil || r.end.Status != "exit status 0" {
				t.Fatalf("true: %+v", r.end)
			}
		})
	}
}

// TestProcessEnvCwdUser: the user of the Basic auth header (or /init's
// default, or the container's own), its home as the cwd, and the
// environment layered container < user < /init < request.
func TestProcessEnvCwdUser(t *testing.T) {
	s, client, c := newProcessTest(t)
	s.defaults = map[string]string{"A": "init", "B": "init"}
	req := start("sh", "-c", `echo "$HOME $USER $LOGNAME $A $B $FROM_IMAGE"; pwd`)
	req.Process.Envs = map[string]string{"B": "request"}
	run := func(user string, req *rpc.StartRequest) (*result, Command) {
		t.Helper()
		st, err := client.Start(context.Background(), withToken(req, user))
		if err != nil {
			t.Fatal(err)
		}
		r := collect(t, st, nil)
		v, _ := spawned.Load(string(c))
		cmds := v.([]Command)
		return r, cmds[len(cmds)-1]
	}
	r, cmd := run("user", req)
	if want := "/home/user user user init request yes\n" + string(c) + "/home/user\n"; r.stdout != want {
		t.Fatalf("as user: %q, want %q", r.stdout, want)
	}
	if cmd.UID != 1000 || cmd.GID != 1000 || len(cmd.Groups) != 1 || cmd.Groups[0] != 10 || cmd.Dir != "/home/user" || !cmd.Stdin || cmd.PTY != nil {
		t.Fatalf("as user: command %+v", cmd)
	}
	for _, kv := range cmd.Env {
		if strings.HasPrefix(kv, "HOME=") && kv != "HOME=/home/user" {
			t.Fatalf("env has %s besides the user's home: %v", kv, cmd.Env)
		}
	}
	// no user named: the container's own (uid 0, its groups), its home
	if r, cmd = run("", req); !strings.HasPrefix(r.stdout, "/root root root ") || cmd.UID != 0 || len(cmd.Groups) != 1 || cmd.Groups[0] != 10 {
		t.Fatalf("default user: %q %+v", r.stdout, cmd)
	}
	// /init's default user and workdir
	s.user, s.workdir = "user", "/tmp"
	if r, cmd = run("", req); cmd.UID != 1000 || cmd.Dir != "/tmp" {
		t.Fatalf("init's defaults: %q %+v", r.stdout, cmd)
	}
	// a relative cwd starts at the home; ~ is the home
	req.Process.Cwd = new("~/")
	if _, cmd = run("user", req); cmd.Dir != "/home/user" {
		t.Fatalf("cwd ~/: %q", cmd.Dir)
	}
	req.Process.Cwd = new("../user")
	if _, cmd = run("user", req); cmd.Dir != "/home/user" {
		t.Fatalf("cwd ../user: %q", cmd.Dir)
	}
	startErr := func(req *rpc.StartRequest, user string) error {
		st, err := client.Start(context.Background(), withToken(req, user))
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
		}
		return st.Err() // a server stream's error comes with its first receive
	}
	req.Process.Cwd = new("/nonexistent")
	if err := startErr(req, "user"); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("missing cwd: %v, want invalid argument", err)
	}
	req.Process.Cwd = nil
	if err := startErr(req, "nobody"); codeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "nobody") {
		t.Fatalf("unknown user: %v, want unauthenticated naming it", err)
	}
	if err := startErr(start("/nonexistent/binary"), ""); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("missing binary: %v, want invalid argument", err)
	}
	noStdin := start("true")
	noStdin.Stdin = new(false)
	if _, cmd = run("", noStdin); cmd.Stdin {
		t.Fatal("stdin=false started with stdin")
	}
}

// TestProcessStdin: SendInput, StreamInput and CloseStdin reach a
// process's stdin.
func TestProcessStdin(t *testing.T) {
	_, client, _ := newProcessTest(t)
	ctx := context.Background()
	st, err := client.Start(ctx, withToken(start("cat"), ""))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	pid := st.Msg().GetEvent().GetStart().GetPid()
	sel := &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: pid}}
	if _, err := client.SendInput(ctx, withToken(&rpc.SendInputRequest{Process: sel, Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("one\n")}}}, "")); err != nil {
		t.Fatal(err)
	}
	in := client.StreamInput(ctx)
	in.RequestHeader().Set("X-Access-Token", testToken)
	in.Send(&rpc.StreamInputRequest{Event: &rpc.StreamInputRequest_Start{Start: &rpc.StreamInputRequest_StartEvent{Process: sel}}})
	for _, s := range []string{"two\n", "three\n"} {
		in.Send(&rpc.StreamInputRequest{Event: &rpc.StreamInputRequest_Data{Data: &rpc.StreamInputRequest_DataEvent{Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte(s)}}}}})
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.SendInput(ctx, withToken(&rpc.SendInputRequest{Process: sel, Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Pty{Pty: []byte("x")}}}, "")); codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("pty input to a process without a terminal: %v", err)
	}
	if _, err := client.CloseStdin(ctx, withToken(&rpc.CloseStdinRequest{Process: sel}, "")); err != nil {
		t.Fatal(err)
	}
	r := collect(t, st, nil)
	if r.stdout != "one\ntwo\nthree\n" || r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("cat: %+v", r)
	}
}

// TestProcessSignal: SIGKILL ends a process with E2B's "signal: killed";
// an unknown pid is NotFound (the SDK's kill returns false on it).
func TestProcessSignal(t *testing.T) {
	_, client, _ := newProcessTest(t)
	ctx := context.Background()
	st, err := client.Start(ctx, withToken(start("sleep", "100"), ""))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	pid := st.Msg().GetEvent().GetStart().GetPid()
	kill := func(pid uint32, sig rpc.Signal) error {
		_, err := client.SendSignal(ctx, withToken(&rpc.SendSignalRequest{Process: &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: pid}}, Signal: sig}, ""))
		return err
	}
	if err := kill(pid, rpc.Signal_SIGNAL_UNSPECIFIED); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("unspecified signal: %v", err)
	}
	if err := kill(pid, rpc.Signal_SIGNAL_SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := collect(t, st, nil)
	if e := r.end; e == nil || e.ExitCode != -1 || e.Exited || e.Status != "signal: killed" || e.GetError() != "signal: killed" {
		t.Fatalf("end = %v, want signal: killed", r.end)
	}
	if err := kill(pid, rpc.Signal_SIGNAL_SIGTERM); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to an ended process: %v, want not found", err)
	}
}

// TestProcessConnectList: a background process goes on when its Start
// stream goes; List shows it with its config and tag; Connect by pid or
// tag gets its output, the backlog written while nobody was connected
// first, and a second subscriber gets the output from then on; both get
// the end.
func TestProcessConnectList(t *testing.T) {
	_, client, _ := newProcessTest(t)
	ctx := context.Background()
	req := start("sh", "-c", `sleep 0.3; echo backlog; while read l; do echo "got $l"; done`)
	req.Tag = new("bg")
	sctx, cancel := context.WithCancel(ctx)
	st, err := client.Start(sctx, withToken(req, ""))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	pid := st.Msg().GetEvent().GetStart().GetPid()
	cancel() // disconnect
	st.Close()

	list, err := client.List(ctx, withToken(&rpc.ListRequest{}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetTag() != "bg" || ps[0].GetConfig().GetCmd() != "sh" || len(ps[0].GetConfig().GetArgs()) != 2 {
		t.Fatalf("list = %v, want pid %d tagged bg", ps, pid)
	}
	time.Sleep(600 * time.Millisecond) // "backlog" is written meanwhile

	c1, err := client.Connect(ctx, withToken(&rpc.ConnectRequest{Process: &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: pid}}}, ""))
	if err != nil {
		t.Fatal(err)
	}
	r1 := collect(t, c1, func(r *result) bool { return strings.Contains(r.stdout, "backlog\n") })
	if r1.pid != pid {
		t.Fatalf("connect: start pid %d, want %d", r1.pid, pid)
	}
	c2, err := client.Connect(ctx, withToken(&rpc.ConnectRequest{Process: &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Tag{Tag: "bg"}}}, ""))
	if err != nil {
		t.Fatal(err)
	}
	c2.Receive() // its start: it is subscribed
	sel := &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: pid}}
	if _, err := client.SendInput(ctx, withToken(&rpc.SendInputRequest{Process: sel, Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("x\n")}}}, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CloseStdin(ctx, withToken(&rpc.CloseStdinRequest{Process: sel}, "")); err != nil {
		t.Fatal(err)
	}
	r1 = collect(t, c1, nil)
	r2 := collect(t, c2, nil)
	if r1.stdout != "got x\n" || r2.stdout != "got x\n" || r1.end == nil || r2.end == nil || r2.end.ExitCode != 0 {
		t.Fatalf("subscribers: %+v and %+v, want both to get the output and end", r1, r2)
	}
	list, _ = client.List(ctx, withToken(&rpc.ListRequest{}, ""))
	if len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("list after the end: %v", list.Msg.GetProcesses())
	}
}

// TestProcessE2BSandboxEnv: every process has E2B_SANDBOX=true, as in
// E2B's envd, unless /init's env vars or the request's set it.
func TestProcessE2BSandboxEnv(t *testing.T) {
	s, client, c := newProcessTest(t)
	run := func(req *rpc.StartRequest) string {
		t.Helper()
		st, err := client.Start(context.Background(), withToken(req, ""))
		if err != nil {
			t.Fatal(err)
		}
		collect(t, st, nil)
		v, _ := spawned.Load(string(c))
		cmds := v.([]Command)
		var got []string
		for _, kv := range cmds[len(cmds)-1].Env {
			if strings.HasPrefix(kv, "E2B_SANDBOX=") {
				got = append(got, kv)
			}
		}
		return strings.Join(got, " ")
	}
	if got := run(start("true")); got != "E2B_SANDBOX=true" {
		t.Errorf("by default: %q, want E2B_SANDBOX=true", got)
	}
	s.defaults = map[string]string{"E2B_SANDBOX": "init"}
	if got := run(start("true")); got != "E2B_SANDBOX=init" {
		t.Errorf("with /init's: %q, want E2B_SANDBOX=init", got)
	}
	req := start("true")
	req.Process.Envs = map[string]string{"E2B_SANDBOX": "request"}
	if got := run(req); got != "E2B_SANDBOX=request" {
		t.Errorf("with the request's: %q, want E2B_SANDBOX=request", got)
	}
}

// TestProcessConnectEnded: for endedTTL after its end, Connect by pid or
// tag answers for a process with its start and end events, as E2B's envd
// does; List and the other calls know it no more, and then neither does
// Connect.
func TestProcessConnectEnded(t *testing.T) {
	s, client, _ := newProcessTest(t)
	var skew atomic.Int64
	s.processes.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	ctx := context.Background()
	req := start("sh", "-c", "echo gone; exit 7")
	req.Tag = new("job")
	st, err := client.Start(ctx, withToken(req, ""))
	if err != nil {
		t.Fatal(err)
	}
	pid := collect(t, st, nil).pid
	waitGone(t, s, pid, "the ended process is still live")
	byPid := &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: pid}}
	byTag := &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Tag{Tag: "job"}}
	for _, sel := range []*rpc.ProcessSelector{byPid, byTag} {
		c, err := client.Connect(ctx, withToken(&rpc.ConnectRequest{Process: sel}, ""))
		if err != nil {
			t.Fatal(err)
		}
		if r := collect(t, c, nil); r.pid != pid || r.stdout != "" || r.end == nil || r.end.ExitCode != 7 || r.end.Status != "exit status 7" {
			t.Fatalf("connect %v after the end: %+v, want its start and end only", sel, r)
		}
	}
	if list, err := client.List(ctx, withToken(&rpc.ListRequest{}, "")); err != nil || len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("list after the end: %v %v, want none", list, err)
	}
	if _, err := client.SendSignal(ctx, withToken(&rpc.SendSignalRequest{Process: byPid, Signal: rpc.Signal_SIGNAL_SIGKILL}, "")); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to an ended process: %v, want not found", err)
	}
	skew.Store(int64(endedTTL))
	for _, sel := range []*rpc.ProcessSelector{byPid, byTag} {
		c, _ := client.Connect(ctx, withToken(&rpc.ConnectRequest{Process: sel}, ""))
		for c.Receive() { // a server stream's error comes with its first receive
		}
		if codeOf(c.Err()) != connect.CodeNotFound {
			t.Fatalf("connect %v after %s: %v, want not found", sel, endedTTL, c.Err())
		}
	}
}

// TestProcessEndedBound: at most maxEnded ends are kept, the oldest
// dropped, and a pid reused names its newest process.
func TestProcessEndedBound(t *testing.T) {
	ps := newProcessService(nil)
	for pid := range uint32(maxEnded + 1) {
		ps.retire(&proc{pid: pid, end: &rpc.ProcessEvent_EndEvent{ExitCode: int32(pid)}})
	}
	ps.retire(&proc{pid: 5, end: &rpc.ProcessEvent_EndEvent{ExitCode: -5}})
	if len(ps.ended) != maxEnded {
		t.Fatalf("%d ends kept, want %d", len(ps.ended), maxEnded)
	}
	pid := func(p uint32) *rpc.ProcessSelector {
		return &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: p}}
	}
	for _, p := range []uint32{0, 1} {
		if _, ok := ps.lookupEnded(pid(p)); ok {
			t.Errorf("the end of %d, among the oldest, is kept", p)
		}
	}
	if e, ok := ps.lookupEnded(pid(maxEnded)); !ok || e.end.ExitCode != maxEnded {
		t.Errorf("the newest end: %+v %v", e, ok)
	}
	if e, ok := ps.lookupEnded(pid(5)); !ok || e.end.ExitCode != -5 {
		t.Errorf("pid 5 reused: %+v %v, want its newest end", e, ok)
	}
}

// TestProcessPty: a terminal of the asked size, resized by Update, input
// through pty input; no stdin to close.
func TestProcessPty(t *testing.T) {
	_, client, _ := newProcessTest(t)
	ctx := context.Background()
	req := start("sh", "-c", `stty size; read l; stty size; echo "got-$l"`)
	req.Pty = &rpc.PTY{Size: &rpc.PTY_Size{Cols: 80, Rows: 24}}
	st, err := client.Start(ctx, withToken(req, ""))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, st, func(r *result) bool { return strings.Contains(r.pty, "24 80") })
	sel := &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: r.pid}}
	if _, err := client.Update(ctx, withToken(&rpc.UpdateRequest{Process: sel, Pty: &rpc.PTY{Size: &rpc.PTY_Size{Cols: 100, Rows: 30}}}, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CloseStdin(ctx, withToken(&rpc.CloseStdinRequest{Process: sel}, "")); codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("close stdin of a terminal: %v", err)
	}
	if _, err := client.SendInput(ctx, withToken(&rpc.SendInputRequest{Process: sel, Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("x")}}}, "")); codeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stdin input to a terminal: %v", err)
	}
	if _, err := client.SendInput(ctx, withToken(&rpc.SendInputRequest{Process: sel, Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Pty{Pty: []byte("abc\n")}}}, "")); err != nil {
		t.Fatal(err)
	}
	rest := collect(t, st, nil)
	if !strings.Contains(rest.pty, "30 100") || !strings.Contains(rest.pty, "got-abc") || rest.end == nil || rest.end.ExitCode != 0 {
		t.Fatalf("pty output %q end %v", rest.pty, rest.end)
	}
	if rest.stdout != "" || rest.stderr != "" {
		t.Fatalf("a terminal's output came as stdout %q stderr %q", rest.stdout, rest.stderr)
	}
}

// TestProcessKeepalive: an idle stream sends keepalives at the interval
// the client's Keepalive-Ping-Interval header asks for.
func TestProcessKeepalive(t *testing.T) {
	_, client, _ := newProcessTest(t)
	req := withToken(start("sleep", "2.5"), "")
	req.Header().Set("Keepalive-Ping-Interval", "1")
	st, err := client.Start(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, st, nil); r.keepalives < 2 || r.end == nil {
		t.Fatalf("%d keepalives in 2.5 s at 1 s, end %v", r.keepalives, r.end)
	}
}

// TestProcessTimeout: the request's timeout (the SDK's timeoutMs) kills
// the process, as E2B's envd does.
func TestProcessTimeout(t *testing.T) {
	s, client, _ := newProcessTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	st, err := client.Start(ctx, withToken(start("sleep", "100"), ""))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	pid := st.Msg().GetEvent().GetStart().GetPid()
	waitGone(t, s, pid, "the process outlived its request's timeout")
}

// waitGone waits up to 5 s for process pid to leave the live ones, and
// fails with msg if it does not.
func waitGone(t *testing.T, s *Server, pid uint32, msg string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.processes.mu.Lock()
		_, running := s.processes.procs[pid]
		s.processes.mu.Unlock()
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
	}
}

func TestProcessNotFound(t *testing.T) {
	_, client, _ := newProcessTest(t)
	ctx := context.Background()
	sel := &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: 999999}}
	for name, call := range map[string]func() error{
		"input": func() error {
			_, err := client.SendInput(ctx, withToken(&rpc.SendInputRequest{Process: sel}, ""))
			return err
		},
		"signal": func() error {
			_, err := client.SendSignal(ctx, withToken(&rpc.SendSignalRequest{Process: sel}, ""))
			return err
		},
		"close": func() error {
			_, err := client.CloseStdin(ctx, withToken(&rpc.CloseStdinRequest{Process: sel}, ""))
			return err
		},
		"update": func() error {
			_, err := client.Update(ctx, withToken(&rpc.UpdateRequest{Process: sel}, ""))
			return err
		},
	} {
		if err := call(); codeOf(err) != connect.CodeNotFound {
			t.Errorf("%s to an unknown pid: %v, want not found", name, err)
		}
	}
	if _, err := client.SendInput(ctx, withToken(&rpc.SendInputRequest{}, "")); codeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("no selector: %v, want invalid argument", err)
	}
}

// TestOutputBacklog: with nobody connected the process never blocks and
// the newest output is kept for the next subscriber; a connected
// subscriber holds the writer back once it is limit behind.
func TestOutputBacklog(t *testing.T) {
	o := newOutput(2 * (eventOverhead + 4)) // two events of 4 bytes
	ev := func(s string) *rpc.ProcessEvent_DataEvent {
		return &rpc.ProcessEvent_DataEvent{Output: &rpc.ProcessEvent_DataEvent_Stdout{Stdout: []byte(s)}}
	}
	for i := range 5 {
		o.put(ev(fmt.Sprintf("%04d", i))) // never blocks
	}
	s := o.subscribe()
	var got []string
	for {
		e, _, _ := s.next()
		if e == nil {
			break
		}
		got = append(got, string(e.GetStdout()))
	}
	if strings.Join(got, ",") != "0003,0004" {
		t.Fatalf("backlog %v, want the newest two", got)
	}
	late := o.subscribe()
	o.put(ev("0123"))
	o.put(ev("4567")) // fills the limit
	put := make(chan struct{})
	go func() { o.put(ev("x")); close(put) }()
	select {
	case <-put:
		t.Fatal("a writer the limit ahead of its subscribers was not held back")
	case <-time.After(100 * time.Millisecond):
	}
	s.next()
	late.next()
	select {
	case <-put:
	case <-time.After(time.Second):
		t.Fatal("the writer was not let go once its subscribers read")
	}
	s.cancel()
	late.cancel()
	o.close()
	if _, _, more := o.subscribe().next(); !more {
		t.Fatal("the unread x was dropped with its subscribers")
	}
}

// TestProcessBashFallback: the SDK runs everything through /bin/bash; a
// container without it runs the command with its /bin/sh, one with it
// with bash.
func TestProcessBashFallback(t *testing.T) {
	_, client, c := newProcessTest(t)
	last := func() Command {
		v, _ := spawned.Load(string(c))
		cmds := v.([]Command)
		return cmds[len(cmds)-1]
	}
	run := func() {
		t.Helper()
		st, err := client.Start(context.Background(), withToken(start("/bin/bash", "-l", "-c", "echo hi"), ""))
		if err != nil {
			t.Fatal(err)
		}
		collect(t, st, nil)
	}
	run()
	if got := last().Args; got[0] != "/bin/sh" || got[3] != "echo hi" {
		t.Fatalf("without /bin/bash in the container: ran %q, want /bin/sh with the same flags", got)
	}
	if err := os.MkdirAll(filepath.Join(string(c), "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(string(c), "bin/bash"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run()
	if got := last().Args[0]; got != "/bin/bash" {
		t.Fatalf("with /bin/bash in the container: ran %q", got)
	}
}
