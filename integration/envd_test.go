//go:build integration

package integration

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cryo-runtime/cryo/agent/envd"
	rpc "github.com/cryo-runtime/cryo/agent/envd/spec/process"
	"github.com/cryo-runtime/cryo/agent/envd/spec/process/processconnect"
	"github.com/cryo-runtime/cryo/integration/harness"
	"github.com/cryo-runtime/cryo/stack"
)

// envdCounter counts in a shell loop, one number a line, the last one also
// in /tmp/count.
const envdCounter = `i=0; while true; do i=$((i+1)); echo $i; echo $i > /tmp/count; sleep 0.2; done`

// TestEnvdProcess: a pod with cryo.dev/envd-access-token-sha256 serves
// envd on <podIP>:49983 from its guest: requests without the token are
// refused, /init takes it, a Go Connect client (binary and JSON codecs)
// runs commands inside the pod's container, as its users, and reconnects
// by pid to a background counter; the container's own processes are
// untouched. Checkpointed and restored into a new pod, the same pid's
// counter has moved on, with the same token.
func TestEnvdProcess(t *testing.T) {
	c := harness.StartCRI(t)
	token := randomToken(t)
	sum := sha256.Sum256([]byte(token))
	hash := hex.EncodeToString(sum[:])
	store := c.StoreURL("envd:v1")
	srcCfg := c.PodConfig("envd-src", map[string]string{"cryo.dev/checkpoint-to": store, envd.Annotation: hash})
	src := c.RunPod(srcCfg)
	srcIP := podIP(t, c, src)
	appArgs := []string{"sh", "-c", "echo inside > /marker; exec sleep inf"}
	app := c.StartContainer(src, c.ContainerConfig("app", appArgs, nil), srcCfg)
	hc := netnsHTTPClient(t, c.NetNS)
	base := "http://" + net.JoinHostPort(srcIP, strconv.Itoa(envd.Port))

	waitHealth(t, hc, base)
	if code, body := post(t, hc, base+"/process.Process/List", "", "{}"); code != http.StatusUnauthorized || !strings.Contains(body, `"code":401`) {
		t.Fatalf("List without the token: %d %s, want 401", code, body)
	}
	if code, _ := post(t, hc, base+"/process.Process/List", "wrong", "{}"); code != http.StatusUnauthorized {
		t.Fatalf("List with a wrong token: %d, want 401", code)
	}
	if code, body := post(t, hc, base+"/init", "", `{"accessToken":"wrong"}`); code != http.StatusUnauthorized {
		t.Fatalf("/init with a wrong token: %d %s, want 401", code, body)
	}
	if code, body := post(t, hc, base+"/init", "", fmt.Sprintf(`{"accessToken":%q,"envVars":{"FROM_INIT":"yes"}}`, token)); code != http.StatusNoContent {
		t.Fatalf("/init: %d %s, want 204", code, body)
	}

	for _, codec := range []struct {
		name string
		opts []connect.ClientOption
	}{{"proto", nil}, {"json", []connect.ClientOption{connect.WithProtoJSON()}}} {
		client := processconnect.NewProcessClient(hc, base, codec.opts...)
		// inside the container: its root (the marker), its pid namespace
		// (the app is its pid 1), /init's env
		r := envdRun(t, client, token, "", "sh", "-c", `cat /marker; tr '\0' ' ' < /proc/1/cmdline; echo; echo "from-init=$FROM_INIT"; echo err >&2; exit 3`)
		if want := "inside\nsleep inf \nfrom-init=yes\n"; r.stdout != want || r.stderr != "err\n" {
			t.Fatalf("%s: stdout %q stderr %q, want %q and err", codec.name, r.stdout, r.stderr, want)
		}
		if r.end == nil || r.end.ExitCode != 3 || r.end.Status != "exit status 3" {
			t.Fatalf("%s: end %v, want exit status 3", codec.name, r.end)
		}
	}
	client := processconnect.NewProcessClient(hc, base)
	// a user of the container's /etc/passwd, in its home
	if r := envdRun(t, client, token, "nobody", "sh", "-c", "id -u; id -g; pwd"); r.stdout != "65534\n65534\n/\n" {
		t.Fatalf("as nobody: %q", r.stdout)
	}
	if r := envdRun(t, client, token, "", "id", "-u"); r.stdout != "0\n" {
		t.Fatalf("as the container's own user: %q", r.stdout)
	}
	st, _ := client.Start(context.Background(), withToken(&rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "true"}}, token, "ghost"))
	for st.Receive() {
	}
	if code := connect.CodeOf(st.Err()); code != connect.CodeUnauthenticated || !strings.Contains(st.Err().Error(), "ghost") {
		t.Fatalf("an unknown user: %v, want unauthenticated naming it", st.Err())
	}

	envdStdinPtySignal(t, client, token)

	// a background counter, left by its Start stream
	ctx, cancel := context.WithCancel(context.Background())
	req := withToken(&rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "sh", Args: []string{"-c", envdCounter}}, Tag: new("counter")}, token, "")
	st, err := client.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	first := readCounter(t, st, 0)
	pid := first.pid
	cancel()
	st.Close()
	list, err := client.List(context.Background(), withToken(&rpc.ListRequest{}, token, ""))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetTag() != "counter" {
		t.Fatalf("List = %v, want the counter, pid %d", ps, pid)
	}
	// the pid is the container's: its own ps shows the loop under it
	if ps := execOut(t, c, app, "ps"); !hasProcess(ps, pid, "i=0") {
		t.Fatalf("the container's ps has no counter at pid %d:\n%s", pid, ps)
	}
	before := connectCounter(t, client, token, pid, first.n+3)
	// the container's own process is untouched
	if cmd := execOut(t, c, app, "cat", "/proc/1/cmdline"); !strings.HasPrefix(cmd, "sleep") {
		t.Fatalf("the container's pid 1 is now %q", cmd)
	}
	if state := c.MustCrictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", app); state != "CONTAINER_RUNNING" {
		t.Fatalf("app is %s", state)
	}

	// a pod without the annotation has no envd
	plainCfg := c.PodConfig("plain", nil)
	plain := c.RunPod(plainCfg)
	c.StartContainer(plain, c.ContainerConfig("app", appArgs, nil), plainCfg)
	if resp, err := hc.Get("http://" + net.JoinHostPort(podIP(t, c, plain), strconv.Itoa(envd.Port)) + "/health"); err == nil {
		resp.Body.Close()
		t.Fatalf("a pod without %s answers on the envd port: %s", envd.Annotation, resp.Status)
	}
	c.MustCrictl("stopp", plain)
	c.MustCrictl("rmp", plain)

	c.MustCrictl("checkpoint", "--export="+filepath.Join(c.Dir, "envd-checkpoint.tar"), app)
	dstCfg := c.PodConfig("envd-dst", map[string]string{"cryo.dev/restore-from": store, envd.Annotation: hash})
	dst := c.RunPod(dstCfg)
	dstIP := podIP(t, c, dst)
	c.StartContainer(dst, c.ContainerConfig("app", appArgs, nil), dstCfg)
	dbase := "http://" + net.JoinHostPort(dstIP, strconv.Itoa(envd.Port))
	waitHealth(t, hc, dbase)
	// no /init in the restored pod: its envd kept the token. What the
	// counter wrote after the restore, and its stream beyond that, come
	// from the restored process.
	dclient := processconnect.NewProcessClient(hc, dbase)
	r := envdRun(t, dclient, token, "", "cat", "/tmp/count")
	restored, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil || restored < before {
		t.Fatalf("the restored counter's file: %q (%v), want at least %d", r.stdout, err, before)
	}
	after := connectCounter(t, dclient, token, pid, restored+5)
	t.Logf("counter pid %d: %d before the checkpoint, %d after the restore, then %d over Connect", pid, before, restored, after)
	if code, _ := post(t, hc, dbase+"/process.Process/List", "", "{}"); code != http.StatusUnauthorized {
		t.Fatalf("the restored envd answers List without the token: %d", code)
	}
	for _, p := range []string{src, dst} {
		c.MustCrictl("stopp", p)
		c.MustCrictl("rmp", p)
	}
}

// hasProcess reports whether ps's output lists pid running something
// with want in its command line.
func hasProcess(ps string, pid uint32, want string) bool {
	for _, l := range strings.Split(ps, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == strconv.Itoa(int(pid)) && strings.Contains(l, want) {
			return true
		}
	}
	return false
}

// envdStdinPtySignal: stdin to EOF, a terminal of the asked size resized,
// and SIGKILL, through the guest's exec machinery.
func envdStdinPtySignal(t *testing.T, client processconnect.ProcessClient, token string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	startIt := func(req *rpc.StartRequest) (*connect.ServerStreamForClient[rpc.StartResponse], *rpc.ProcessSelector) {
		t.Helper()
		st, err := client.Start(ctx, withToken(req, token, ""))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if !st.Receive() {
			t.Fatalf("%v: %v", req.GetProcess(), st.Err())
		}
		return st, &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	}
	rest := func(st *connect.ServerStreamForClient[rpc.StartResponse]) (out string, end *rpc.ProcessEvent_EndEvent) {
		for st.Receive() {
			ev := st.Msg().GetEvent()
			out += string(ev.GetData().GetStdout()) + string(ev.GetData().GetPty())
			if e := ev.GetEnd(); e != nil {
				end = e
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		return out, end
	}
	input := func(sel *rpc.ProcessSelector, in *rpc.ProcessInput) {
		t.Helper()
		if _, err := client.SendInput(ctx, withToken(&rpc.SendInputRequest{Process: sel, Input: in}, token, "")); err != nil {
			t.Fatal(err)
		}
	}

	st, sel := startIt(&rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "cat"}, Stdin: new(true)})
	input(sel, &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("to-cat\n")}})
	if _, err := client.CloseStdin(ctx, withToken(&rpc.CloseStdinRequest{Process: sel}, token, "")); err != nil {
		t.Fatal(err)
	}
	if out, end := rest(st); out != "to-cat\n" || end.GetExitCode() != 0 {
		t.Fatalf("cat: %q %v", out, end)
	}

	st, sel = startIt(&rpc.StartRequest{
		Process: &rpc.ProcessConfig{Cmd: "sh", Args: []string{"-c", `tty; stty size; read l; stty size; echo "got-$l"`}},
		Pty:     &rpc.PTY{Size: &rpc.PTY_Size{Cols: 80, Rows: 24}},
	})
	var first string
	for !strings.Contains(first, "24 80") && st.Receive() {
		first += string(st.Msg().GetEvent().GetData().GetPty())
	}
	if _, err := client.Update(ctx, withToken(&rpc.UpdateRequest{Process: sel, Pty: &rpc.PTY{Size: &rpc.PTY_Size{Cols: 100, Rows: 30}}}, token, "")); err != nil {
		t.Fatal(err)
	}
	input(sel, &rpc.ProcessInput{Input: &rpc.ProcessInput_Pty{Pty: []byte("x\n")}})
	if out, end := rest(st); !strings.Contains(first, "/dev/pts/") || !strings.Contains(out, "30 100") || !strings.Contains(out, "got-x") || end.GetExitCode() != 0 {
		t.Fatalf("pty: %q then %q, %v", first, out, end)
	}

	st, sel = startIt(&rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "sleep", Args: []string{"100"}}})
	if _, err := client.SendSignal(ctx, withToken(&rpc.SendSignalRequest{Process: sel, Signal: rpc.Signal_SIGNAL_SIGKILL}, token, "")); err != nil {
		t.Fatal(err)
	}
	if _, end := rest(st); end.GetExitCode() != -1 || end.GetStatus() != "signal: killed" {
		t.Fatalf("killed: %v", end)
	}
}

// netnsHTTPClient reaches the pod network from the host end of it.
func netnsHTTPClient(t *testing.T, path string) *http.Client {
	tr := &http.Transport{DialContext: stack.DialInNetNS(path)}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func randomToken(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func waitHealth(t *testing.T, hc *http.Client, base string) {
	t.Helper()
	var last string
	if !harness.WaitFor(60*time.Second, func() bool {
		resp, err := hc.Get(base + "/health")
		if err != nil {
			last = err.Error()
			return false
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusNoContent
	}) {
		t.Fatalf("GET %s/health: %s, want 204", base, last)
	}
}

func post(t *testing.T, hc *http.Client, url, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func withToken[T any](m *T, token, user string) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set("X-Access-Token", token)
	r.Header().Set("Keepalive-Ping-Interval", "5")
	if user != "" {
		hr, _ := http.NewRequest("GET", "/", nil)
		hr.SetBasicAuth(user, "")
		r.Header().Set("Authorization", hr.Header.Get("Authorization"))
	}
	return r
}

type envdResult struct {
	pid            uint32
	stdout, stderr string
	end            *rpc.ProcessEvent_EndEvent
}

// envdRun runs a command to its end.
func envdRun(t *testing.T, client processconnect.ProcessClient, token, user, cmd string, args ...string) envdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := client.Start(ctx, withToken(&rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: cmd, Args: args}}, token, user))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var r envdResult
	for st.Receive() {
		switch ev := st.Msg().GetEvent().GetEvent().(type) {
		case *rpc.ProcessEvent_Start:
			r.pid = ev.Start.GetPid()
		case *rpc.ProcessEvent_Data:
			r.stdout += string(ev.Data.GetStdout())
			r.stderr += string(ev.Data.GetStderr())
		case *rpc.ProcessEvent_End:
			r.end = ev.End
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("%s %v: %v", cmd, args, err)
	}
	return r
}

type counterState struct {
	pid uint32
	n   int
}

// readCounter reads a counter's stream until it counted past n; it returns
// the last number seen.
func readCounter[T interface{ GetEvent() *rpc.ProcessEvent }](t *testing.T, st interface {
	Receive() bool
	Msg() T
	Err() error
}, n int) counterState {
	t.Helper()
	var s counterState
	var partial string
	for st.Receive() {
		switch ev := st.Msg().GetEvent().GetEvent().(type) {
		case *rpc.ProcessEvent_Start:
			s.pid = ev.Start.GetPid()
		case *rpc.ProcessEvent_Data:
			partial += string(ev.Data.GetStdout())
			lines := strings.Split(partial, "\n")
			partial = lines[len(lines)-1]
			for _, l := range lines[:len(lines)-1] {
				if v, err := strconv.Atoi(l); err == nil {
					s.n = v
				}
			}
			if s.n > n {
				return s
			}
		case *rpc.ProcessEvent_End:
			t.Fatalf("the counter ended: %v", ev.End)
		}
	}
	t.Fatalf("the counter's stream ended at %d: %v", s.n, st.Err())
	return s
}

// connectCounter connects to the counter at pid and reads it until it
// counted past n; it returns the number then.
func connectCounter(t *testing.T, client processconnect.ProcessClient, token string, pid uint32, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := client.Connect(ctx, withToken(&rpc.ConnectRequest{Process: &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: pid}}}, token, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := readCounter(t, st, n)
	if s.pid != pid {
		t.Fatalf("Connect(%d) started with pid %d", pid, s.pid)
	}
	return s.n
}
