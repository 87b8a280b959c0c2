package envd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	rpc "github.com/cryo-runtime/cryo/agent/envd/spec/process"
	"github.com/cryo-runtime/cryo/agent/envd/spec/process/processconnect"
)

// ProcessSpec is how the container's own process runs.
type ProcessSpec struct {
	UID, GID uint32
	Groups   []uint32 // supplementary groups
	Env      []string // KEY=value
}

// Command is a process to start in the container.
type Command struct {
	// Args[0] is found in the PATH of Env inside the container when it has
	// no slash.
	Args     []string
	Env      []string // KEY=value, no duplicates
	Dir      string   // absolute, inside the container
	UID, GID uint32
	Groups   []uint32 // supplementary groups
	// Stdin gives the process a pipe on stdin; without it stdin is
	// /dev/null. A PTY has its own.
	Stdin bool
	// PTY, when set, puts stdin, stdout and stderr on a new terminal of
	// that size, the process leading its session.
	PTY *WindowSize
}

// WindowSize is a terminal's size in characters.
type WindowSize struct{ Cols, Rows uint16 }

// Process is a process Spawn started.
type Process interface {
	// Pid is the process's pid in the container's pid namespace.
	Pid() uint32
	// Stdin writes to the process's stdin pipe or its terminal; nil when
	// it has neither. Close ends a pipe (EOF).
	Stdin() io.WriteCloser
	// Stdout reads the process's stdout, or its terminal's output.
	Stdout() io.Reader
	// Stderr reads the process's stderr; nil with a terminal.
	Stderr() io.Reader
	// Wait blocks until the process exited.
	Wait() Exit
	// Signal's error wraps os.ErrProcessDone once the process exited.
	Signal(sig syscall.Signal) error
	// Resize sets the terminal's size.
	Resize(size WindowSize) error
	// Release lets go of the process's stdio once it exited: its readers
	// return EOF after what they hold, even while a child it left behind
	// still has the pipe or terminal open.
	Release()
}

// Exit is how a process ended.
type Exit struct {
	Code   int            // exit status, when Signal is 0
	Signal syscall.Signal // the signal that killed it
}

const (
	// defaultKeepalive is the idle time after which a stream sends a
	// keepalive event when the client's Keepalive-Ping-Interval header
	// (seconds) sets none, as E2B's envd does.
	defaultKeepalive = 90 * time.Second
	// outputGrace is how long the output of an exited process may still
	// arrive: a child it left in the background can hold its pipes open
	// forever, and the end must not wait for it.
	outputGrace = time.Second
	// writeTimeout ends a stream whose client stopped reading (a peer gone
	// without a FIN, as every client of a sandbox is after a restore into
	// a new pod): it would hold its process's output back.
	writeTimeout = 30 * time.Second
	chunkSize    = 32 << 10
	// endedTTL is how long Connect still answers for a process after its
	// end, as E2B's envd does (terminatedRetentionTTL): the SDK's
	// commands.connect(pid) just after the exit gets the exit code, not
	// NotFound.
	endedTTL = 30 * time.Second
	// maxEnded bounds the ends kept meanwhile: a guest that starts
	// processes in a loop must not grow envd's memory with them.
	maxEnded = 1024
)

// processService serves process.Process: the processes started through
// envd, by pid, until they end, and for endedTTL their ends.
type processService struct {
	s   *Server
	now func() time.Time

	mu    sync.Mutex
	procs map[uint32]*proc
	ended []endedProc // oldest first
}

// endedProc is what Connect needs of a process after its end.
type endedProc struct {
	pid uint32
	tag *string
	end *rpc.ProcessEvent_EndEvent
	at  time.Time
}

var _ processconnect.ProcessHandler = (*processService)(nil)

func newProcessService(s *Server) *processService {
	return &processService{s: s, now: time.Now, procs: map[uint32]*proc{}}
}

func (ps *processService) handler() (string, http.Handler) {
	p, h := processconnect.NewProcessHandler(ps)
	return p, withWriteDeadline(h)
}

// proc is a process started through envd.
type proc struct {
	pid    uint32
	config *rpc.ProcessConfig
	tag    *string
	pty    bool
	handle Process
	out    *output
	done   chan struct{} // closed once end is set and the output closed

	mu          sync.Mutex
	stdinClosed bool
	end         *rpc.ProcessEvent_EndEvent
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[rpc.StartRequest], stream *connect.ServerStream[rpc.StartResponse]) error {
	u, err := ps.s.requestUser(req.Header())
	if err != nil {
		return err
	}
	cmd, err := ps.s.command(u, req.Msg)
	if err != nil {
		return err
	}
	h, err := ps.s.container.Spawn(ctx, cmd)
	if err != nil {
		// a missing binary or cwd: what E2B's envd answers too
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start %s: %w", cmd.Args[0], err))
	}
	p := &proc{
		pid: h.Pid(), config: req.Msg.GetProcess(), tag: req.Msg.Tag, pty: cmd.PTY != nil,
		handle: h, out: newOutput(outputLimit), done: make(chan struct{}),
	}
	sub := p.out.subscribe() // before any output: Start's client gets it all
	ps.add(p)
	go p.run(func() { ps.retire(p) })
	if d := requestTimeout(req.Header()); d > 0 {
		// E2B's SDK sends its command timeout (timeoutMs, 60 s unless
		// set; 0 for none) as the request's; its envd kills the process
		// when it passes, and so does this one.
		t := time.AfterFunc(d, func() { _ = h.Signal(unix.SIGKILL) })
		go func() { <-p.done; t.Stop() }()
	}
	return p.stream(ctx, sub, keepalive(req.Header()), func(ev *rpc.ProcessEvent) error {
		return stream.Send(&rpc.StartResponse{Event: ev})
	})
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[rpc.ConnectRequest], stream *connect.ServerStream[rpc.ConnectResponse]) error {
	send := func(ev *rpc.ProcessEvent) error { return stream.Send(&rpc.ConnectResponse{Event: ev}) }
	p, err := ps.lookup(req.Msg.GetProcess())
	if err != nil {
		if e, ok := ps.lookupEnded(req.Msg.GetProcess()); ok {
			return e.replay(send)
		}
		return err
	}
	return p.stream(ctx, p.out.subscribe(), keepalive(req.Header()), send)
}

func (ps *processService) List(ctx context.Context, req *connect.Request[rpc.ListRequest]) (*connect.Response[rpc.ListResponse], error) {
	ps.mu.Lock()
	resp := &rpc.ListResponse{}
	for _, p := range ps.procs {
		resp.Processes = append(resp.Processes, &rpc.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
	}
	ps.mu.Unlock()
	sort.Slice(resp.Processes, func(i, j int) bool { return resp.Processes[i].Pid < resp.Processes[j].Pid })
	return connect.NewResponse(resp), nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[rpc.SendInputRequest]) (*connect.Response[rpc.SendInputResponse], error) {
	p, err := ps.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.write(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&rpc.SendInputResponse{}), nil
}

// StreamInput writes each data event, in order, to the process its start
// event names.
func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[rpc.StreamInputRequest]) (*connect.Response[rpc.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *rpc.StreamInputRequest_Start:
			var err error
			if p, err = ps.lookup(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *rpc.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event naming the process"))
			}
			if err := p.write(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&rpc.StreamInputResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[rpc.SendSignalRequest]) (*connect.Response[rpc.SendSignalResponse], error) {
	p, err := ps.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case rpc.Signal_SIGNAL_SIGTERM:
		sig = unix.SIGTERM
	case rpc.Signal_SIGNAL_SIGKILL:
		sig = unix.SIGKILL
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v is not one envd sends", req.Msg.GetSignal()))
	}
	if err := p.handle.Signal(sig); err != nil {
		if p.ended() || errors.Is(err, os.ErrProcessDone) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signal process %d: %w", p.pid, err))
	}
	return connect.NewResponse(&rpc.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[rpc.CloseStdinRequest]) (*connect.Response[rpc.CloseStdinResponse], error) {
	p, err := ps.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.pty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has a terminal, whose stdin cannot be closed: send Ctrl-D (0x04)", p.pid))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.handle.Stdin()
	if w == nil || p.stdinClosed {
		return connect.NewResponse(&rpc.CloseStdinResponse{}), nil
	}
	p.stdinClosed = true
	if err := w.Close(); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("close stdin of process %d: %w", p.pid, err))
	}
	return connect.NewResponse(&rpc.CloseStdinResponse{}), nil
}

// Update resizes a process's terminal.
func (ps *processService) Update(ctx context.Context, req *connect.Request[rpc.UpdateRequest]) (*connect.Response[rpc.UpdateResponse], error) {
	p, err := ps.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if !p.pty {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal to resize", p.pid))
		}
		if err := p.handle.Resize(windowSize(size)); err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("resize the terminal of process %d: %w", p.pid, err))
		}
	}
	return connect.NewResponse(&rpc.UpdateResponse{}), nil
}

func (ps *processService) add(p *proc) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.procs[p.pid] = p
}

// retire moves p, which ended, from the live processes (unless its pid
// went to a newer process already) to the ended ones, in one step: a
// Connect finds it in either.
func (ps *processService) retire(p *proc) {
	p.mu.Lock()
	e := endedProc{pid: p.pid, tag: p.tag, end: p.end}
	p.mu.Unlock()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.procs[p.pid] == p {
		delete(ps.procs, p.pid)
	}
	e.at = ps.now()
	ps.ended = append(ps.ended, e)
	ps.pruneLocked(e.at)
}

// pruneLocked drops the ends past endedTTL and, beyond maxEnded, the
// oldest.
func (ps *processService) pruneLocked(now time.Time) {
	n := 0
	for n < len(ps.ended) && (len(ps.ended)-n > maxEnded || now.Sub(ps.ended[n].at) >= endedTTL) {
		n++
	}
	clear(ps.ended[:n]) // the array outlives the slice
	ps.ended = ps.ended[n:]
}

// lookupEnded finds the newest end sel names: a pid or tag reused since
// names its latest process.
func (ps *processService) lookupEnded(sel *rpc.ProcessSelector) (endedProc, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.pruneLocked(ps.now())
	for i := len(ps.ended) - 1; i >= 0; i-- {
		e := ps.ended[i]
		switch s := sel.GetSelector().(type) {
		case *rpc.ProcessSelector_Pid:
			if e.pid == s.Pid {
				return e, true
			}
		case *rpc.ProcessSelector_Tag:
			if e.tag != nil && *e.tag == s.Tag {
				return e, true
			}
		}
	}
	return endedProc{}, false
}

// replay sends what E2B's envd sends for a process that already ended:
// its start and its end, the output being gone.
func (e endedProc) replay(send func(*rpc.ProcessEvent) error) error {
	if err := send(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_Start{Start: &rpc.ProcessEvent_StartEvent{Pid: e.pid}}}); err != nil {
		return err
	}
	return send(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_End{End: e.end}})
}

func (ps *processService) lookup(sel *rpc.ProcessSelector) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *rpc.ProcessSelector_Pid:
		if p, ok := ps.procs[s.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
	case *rpc.ProcessSelector_Tag:
		for _, p := range ps.procs {
			if p.tag != nil && *p.tag == s.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no process selector (pid or tag)"))
}

// run pumps the process's output into p.out and, once it exited and its
// output is in, sets its end.
func (p *proc) run(retire func()) {
	var wg sync.WaitGroup
	pump := func(r io.Reader, event func([]byte) *rpc.ProcessEvent_DataEvent) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, chunkSize)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					// a copy of its size: the backlog may hold many
					// small chunks
					p.out.put(event(bytes.Clone(buf[:n])))
				}
				if err != nil {
					return
				}
			}
		}()
	}
	if p.pty {
		pump(p.handle.Stdout(), func(b []byte) *rpc.ProcessEvent_DataEvent {
			return &rpc.ProcessEvent_DataEvent{Output: &rpc.ProcessEvent_DataEvent_Pty{Pty: b}}
		})
	} else {
		pump(p.handle.Stdout(), func(b []byte) *rpc.ProcessEvent_DataEvent {
			return &rpc.ProcessEvent_DataEvent{Output: &rpc.ProcessEvent_DataEvent_Stdout{Stdout: b}}
		})
		if r := p.handle.Stderr(); r != nil {
			pump(r, func(b []byte) *rpc.ProcessEvent_DataEvent {
				return &rpc.ProcessEvent_DataEvent{Output: &rpc.ProcessEvent_DataEvent_Stderr{Stderr: b}}
			})
		}
	}
	exit := p.handle.Wait()
	pumped := make(chan struct{})
	go func() { wg.Wait(); close(pumped) }()
	select {
	case <-pumped:
	case <-time.After(outputGrace):
	}
	p.handle.Release()
	<-pumped
	p.mu.Lock()
	p.end = endEvent(exit)
	p.mu.Unlock()
	p.out.close()
	retire()
	close(p.done)
}

func (p *proc) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stream sends the process's start, its output from sub on, keepalives
// while it is idle, and its end.
func (p *proc) stream(ctx context.Context, sub *subscription, every time.Duration, send func(*rpc.ProcessEvent) error) error {
	defer sub.cancel()
	if err := send(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_Start{Start: &rpc.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	idle := time.NewTicker(every)
	defer idle.Stop()
	for {
		ev, wait, more := sub.next()
		if ev != nil {
			if err := send(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_Data{Data: ev}}); err != nil {
				return err
			}
			idle.Reset(every)
			continue
		}
		if !more {
			break
		}
		select {
		case <-wait:
		case <-idle.C:
			if err := send(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_Keepalive{Keepalive: &rpc.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.mu.Lock()
	end := p.end
	p.mu.Unlock()
	return send(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_End{End: end}})
}

// write sends input to the process's stdin or terminal, whichever it has.
func (p *proc) write(in *rpc.ProcessInput) error {
	var b []byte
	switch i := in.GetInput().(type) {
	case *rpc.ProcessInput_Stdin:
		if p.pty {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has a terminal: send pty input, not stdin", p.pid))
		}
		b = i.Stdin
	case *rpc.ProcessInput_Pty:
		if !p.pty {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal: send stdin, not pty input", p.pid))
		}
		b = i.Pty
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("no input (stdin or pty)"))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.handle.Stdin()
	if w == nil || p.stdinClosed {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d: stdin not enabled or closed", p.pid))
	}
	if _, err := w.Write(b); err != nil {
		if p.ended() {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has ended", p.pid))
		}
		return connect.NewError(connect.CodeInternal, fmt.Errorf("write to process %d: %w", p.pid, err))
	}
	return nil
}

// endEvent reports an exit as Go's os.ProcessState does, which is what
// E2B's envd sends: exit_code -1 and "signal: killed" for a killed process.
func endEvent(e Exit) *rpc.ProcessEvent_EndEvent {
	ev := &rpc.ProcessEvent_EndEvent{ExitCode: int32(e.Code), Exited: true, Status: "exit status " + strconv.Itoa(e.Code)}
	if e.Signal != 0 {
		ev.ExitCode, ev.Exited, ev.Status = -1, false, "signal: "+e.Signal.String()
	}
	if ev.ExitCode != 0 {
		ev.Error = &ev.Status
	}
	return ev
}

// requestUser is the user a request runs as: the one its Basic auth header
// names, else /init's default user, else the container's own process user.
func (s *Server) requestUser(h http.Header) (User, error) {
	root, err := s.container.Root()
	if err != nil {
		return User{}, connect.NewError(connect.CodeUnavailable, fmt.Errorf("the sandbox's container: %w", err))
	}
	name, named, err := requestUser(&http.Request{Header: h})
	if err != nil {
		return User{}, connect.NewError(connect.CodeUnauthenticated, err)
	}
	if !named {
		name = s.defaultUser()
	}
	if name != "" {
		u, err := lookupUser(root, name)
		if err != nil {
			return User{}, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("invalid username %q: %w", name, err))
		}
		return u, nil
	}
	spec := s.container.Process()
	u, err := lookupUser(root, strconv.FormatUint(uint64(spec.UID), 10))
	if err != nil {
		return User{}, connect.NewError(connect.CodeUnauthenticated, err)
	}
	// the container's own groups, not /etc/group's
	u.GID, u.Groups = spec.GID, spec.Groups
	return u, nil
}

// command is what Start runs: the container's environment under HOME,
// USER and LOGNAME of the user and E2B_SANDBOX, /init's env vars and then
// the request's, each overriding the ones before; in the request's cwd,
// else /init's default workdir, else the user's home.
func (s *Server) command(u User, req *rpc.StartRequest) (Command, error) {
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return Command{}, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty"))
	}
	s.mu.Lock()
	defaults, workdir := s.defaults, s.workdir
	s.mu.Unlock()
	env := newEnv(s.container.Process().Env)
	env.set("HOME", u.Home)
	env.set("USER", u.Name)
	env.set("LOGNAME", u.Name)
	// what E2B's envd gives every process: code checks it to tell it runs
	// in a sandbox
	env.set("E2B_SANDBOX", "true")
	for _, k := range sortedKeys(defaults) {
		env.set(k, defaults[k])
	}
	for _, k := range sortedKeys(cfg.GetEnvs()) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return Command{}, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("process.envs: bad name %q", k))
		}
		env.set(k, cfg.GetEnvs()[k])
	}
	dir, err := s.resolveCwd(u, cfg.GetCwd(), workdir)
	if err != nil {
		return Command{}, err
	}
	cmd := Command{
		Args: append([]string{s.shell(cfg.GetCmd())}, cfg.GetArgs()...), Env: env.list(), Dir: dir,
		UID: u.UID, GID: u.GID, Groups: u.Groups,
		Stdin: req.Stdin == nil || req.GetStdin(),
	}
	if pty := req.GetPty(); pty != nil {
		size := windowSize(pty.GetSize())
		cmd.PTY, cmd.Stdin = &size, false
	}
	return cmd, nil
}

// shell is the program to run for cmd. The SDK runs every command and
// PTY through /bin/bash (-l -c, -i -l); an image without bash (busybox,
// alpine, distroless shells) runs them with its /bin/sh, which takes the
// same flags, rather than failing every call of an unmodified script.
func (s *Server) shell(cmd string) string {
	if cmd != "/bin/bash" {
		return cmd
	}
	root, err := s.container.Root()
	if err != nil {
		return cmd
	}
	f, err := openInRoot(root, cmd, unix.O_PATH, 0)
	if err == nil {
		f.Close()
		return cmd
	}
	return "/bin/sh"
}

// resolveCwd resolves a process's cwd as E2B's envd does: empty is the
// default workdir, else the home; "~" and relative paths start at the
// home. It must be a directory of the container.
func (s *Server) resolveCwd(u User, cwd, def string) (string, error) {
	if cwd == "" {
		cwd = def
	}
	if rest, ok := strings.CutPrefix(cwd, "~"); ok {
		if rest != "" && rest[0] != '/' {
			return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %q: only the user's own home (~) can be expanded", cwd))
		}
		cwd = u.Home + rest
	}
	if !path.IsAbs(cwd) {
		cwd = path.Join(u.Home, cwd)
	}
	cwd = path.Clean(cwd)
	root, err := s.container.Root()
	if err != nil {
		return "", connect.NewError(connect.CodeUnavailable, fmt.Errorf("the sandbox's container: %w", err))
	}
	f, err := openInRoot(root, cwd, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist", cwd))
	}
	f.Close()
	return cwd, nil
}

// env is an environment in which a later value of a name replaces the
// earlier one in place: execve would keep both, and programs read the
// first.
type env struct {
	names []string
	vals  map[string]string
}

func newEnv(base []string) *env {
	e := &env{vals: map[string]string{}}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			e.set(k, v)
		}
	}
	return e
}

func (e *env) set(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.names = append(e.names, k)
	}
	e.vals[k] = v
}

func (e *env) list() []string {
	out := make([]string, 0, len(e.names))
	for _, k := range e.names {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func windowSize(s *rpc.PTY_Size) WindowSize {
	return WindowSize{Cols: uint16(min(s.GetCols(), 0xffff)), Rows: uint16(min(s.GetRows(), 0xffff))}
}

// keepalive is the idle time the client asks for between events
// (Keepalive-Ping-Interval, seconds).
func keepalive(h http.Header) time.Duration {
	n, err := strconv.ParseInt(h.Get("Keepalive-Ping-Interval"), 10, 64)
	if err != nil || n <= 0 || n > 24*3600 {
		return defaultKeepalive
	}
	return time.Duration(n) * time.Second
}

// requestTimeout is the Connect protocol's Connect-Timeout-Ms header.
func requestTimeout(h http.Header) time.Duration {
	n, err := strconv.ParseInt(h.Get("Connect-Timeout-Ms"), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Millisecond
}

// withWriteDeadline bounds every write of a response, so that a stream to
// a client that stopped reading fails instead of blocking for good, and
// clears the deadline after it: the connection may serve more requests.
func withWriteDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
		defer dw.rc.SetWriteDeadline(time.Time{})
		next.ServeHTTP(dw, r)
	})
}

type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	return d.ResponseWriter.Write(b)
}

func (d *deadlineWriter) Flush() {
	_ = d.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	_ = d.rc.Flush()
}

func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }
