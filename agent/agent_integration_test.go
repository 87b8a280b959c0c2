//go:build integration

package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
)

// TestAgentVM boots one guest and runs every scenario against it.
func TestAgentVM(t *testing.T) {
	vm := startVM(t, "rootfs0", "rootfs1")
	top := t // clients that outlive a subtest are cleaned up with the whole test
	c := vm.dial(top)
	ctx := ctxT(t, 5*time.Minute)

	var bootID string
	t.Run("Ping", func(t *testing.T) {
		pctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		t0 := time.Now()
		r, err := c.Ping(pctx, &agentapi.PingRequest{})
		if err != nil {
			t.Fatalf("ping: %v\nconsole:\n%s", err, consoleTail(vm))
		}
		t.Logf("agent up after %v: boot %s kernel %s uptime %v version %s", time.Since(t0), r.BootId, r.KernelRelease, r.Uptime.AsDuration(), r.AgentVersion)
		var g struct{ KernelRelease string }
		b, _ := os.ReadFile(filepath.Join(guestDir(t), "guest.json"))
		json.Unmarshal(b, &g)
		if r.KernelRelease != g.KernelRelease || len(r.BootId) != 36 || r.Uptime.AsDuration() <= 0 {
			t.Fatalf("ping = %+v, want kernel %q, a boot id and uptime", r, g.KernelRelease)
		}
		bootID = r.BootId
	})
	if t.Failed() {
		return
	}

	t.Run("RunToExit", func(t *testing.T) {
		spec := testSpec("sh", "-c", `echo hi; echo oops >&2; hostname; echo "$FOO"; pwd; cat /etc/hosts; id -u; exit 3`)
		r, err := c.CreateContainer(ctx, &agentapi.CreateContainerRequest{
			Id: "c1", SpecJson: mustJSON(t, spec), Rootfs: &agentapi.Rootfs{Serial: "rootfs0", Fstype: "ext4"},
			Files:  []*agentapi.File{{Path: "/etc/hosts", Content: []byte("127.0.0.1 box\n")}},
			Stdout: true, Stderr: true,
		})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if r.Pid == 0 {
			t.Fatal("create returned pid 0")
		}
		s, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "c1"})
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		if s.Pid != r.Pid {
			t.Errorf("start pid %d != create pid %d", s.Pid, r.Pid)
		}
		stderrc := make(chan string, 1)
		go func() { stderrc <- readAll(t, ctx, c, "c1", "", agentapi.Stream_STREAM_STDERR) }()
		out := readAll(t, ctx, c, "c1", "", agentapi.Stream_STREAM_STDOUT)
		if want := "hi\nbox\nbar\n/tmp\n127.0.0.1 box\n0\n"; out != want {
			t.Errorf("stdout %q, want %q", out, want)
		}
		if e := <-stderrc; e != "oops\n" {
			t.Errorf("stderr %q, want %q", e, "oops\n")
		}
		w, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "c1"})
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
		if w.ExitStatus != 3 || w.ExitedAt.AsTime().IsZero() {
			t.Errorf("exit %d at %v, want 3", w.ExitStatus, w.ExitedAt.AsTime())
		}
		if _, err := c.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{Id: "c1"}); err != nil {
			t.Fatalf("remove: %v", err)
		}
		if _, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "c1"}); !errdefs.IsNotFound(err) {
			t.Errorf("wait after remove: %v, want not found", err)
		}
	})

	t.Run("InitTerminal", func(t *testing.T) {
		spec := testSpec("sh", "-c", `test -t 0 && test -t 1 && echo "tty $HOME"; cd /new/dir && pwd`)
		spec.Process.Terminal = true
		spec.Process.Cwd = "/new/dir" // missing in the image: created
		if _, err := c.CreateContainer(ctx, &agentapi.CreateContainerRequest{Id: "ct", SpecJson: mustJSON(t, spec), Rootfs: &agentapi.Rootfs{Serial: "rootfs0"}, Stdout: true, Terminal: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "ct"}); err != nil {
			t.Fatal(err)
		}
		if out := readAll(t, ctx, c, "ct", "", agentapi.Stream_STREAM_STDOUT); out != "tty /root\r\n/new/dir\r\n" {
			t.Errorf("terminal init printed %q", out)
		}
		if _, err := c.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{Id: "ct"}); err != nil {
			t.Fatal(err)
		}
	})

	// c2 stays up for the exec scenarios: its init records its view and sleeps.
	spec := testSpec("sh", "-c", `echo $$ > /tmp/initpid; hostname > /tmp/host; exec sleep 100000`)
	spec.Hostname = "c2host"
	if _, err := c.CreateContainer(ctx, &agentapi.CreateContainerRequest{Id: "c2", SpecJson: mustJSON(t, spec), Rootfs: &agentapi.Rootfs{Serial: "rootfs1"}}); err != nil {
		t.Fatalf("create c2: %v", err)
	}
	init, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "c2"})
	if err != nil {
		t.Fatalf("start c2: %v", err)
	}

	t.Run("ExecSharesNamespaces", func(t *testing.T) {
		var out string
		for i := 0; i < 50; i++ { // the init writes its files right after start
			out, _ = runExec(t, ctx, c, "c2", "view"+string(rune('a'+i%26))+time.Now().Format("150405.000"), "sh", "-c", `cat /tmp/initpid; hostname; tr '\0' ' ' < /proc/1/cmdline; echo; echo $$`)
			if strings.HasPrefix(out, "1\n") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || lines[0] != "1" || lines[1] != "c2host" || strings.TrimSpace(lines[2]) != "sleep 100000" || lines[3] == "" || len(lines[3]) > 3 {
			t.Fatalf("exec view %q: want init pid 1, hostname c2host, pid 1 = sleep, a small pid of its own", out)
		}
	})

	t.Run("ExecExitStatusAndUser", func(t *testing.T) {
		_, err := c.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "user", Stdout: true,
			ProcessJson: mustJSON(t, &specs.Process{Args: []string{"sh", "-c", "id -u; id -g; id -G; exit 7"}, Env: []string{"PATH=/bin"}, Cwd: "/",
				User: specs.User{UID: 65534, GID: 65534, AdditionalGids: []uint32{10, 20}}, NoNewPrivileges: true,
				Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 123, Hard: 456}}})})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "c2", ExecId: "user"}); err != nil {
			t.Fatal(err)
		}
		out := readAll(t, ctx, c, "c2", "user", agentapi.Stream_STREAM_STDOUT)
		w, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "c2", ExecId: "user"})
		if err != nil {
			t.Fatal(err)
		}
		if out != "65534\n65534\n65534 10 20\n" || w.ExitStatus != 7 {
			t.Fatalf("user exec: %q exit %d", out, w.ExitStatus)
		}
		out, _ = runExec(t, ctx, c, "c2", "nofile", "sh", "-c", "ulimit -n")
		if strings.TrimSpace(out) == "123" {
			t.Fatalf("rlimit leaked into another exec")
		}
	})

	t.Run("Terminal", func(t *testing.T) {
		_, err := c.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "tty", Stdin: true, Stdout: true, Terminal: true,
			ProcessJson: mustJSON(t, &specs.Process{Terminal: true, Args: []string{"sh", "-c", `test -t 0 && echo isatty; read line; stty size; echo "got $line"`}, Env: []string{"PATH=/bin"}, Cwd: "/"})})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "c2", ExecId: "tty"}); err != nil {
			t.Fatal(err)
		}
		// The input goes in once the shell has said isatty: the terminal
		// echoes it, and an echo before that line would split it.
		first := readUntil(t, ctx, c, "c2", "tty", agentapi.Stream_STREAM_STDOUT, "isatty\r\n")
		if _, err := c.ResizePty(ctx, &agentapi.ResizePtyRequest{ContainerId: "c2", ExecId: "tty", Width: 100, Height: 40}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteStdin(ctx, &agentapi.WriteStdinRequest{ContainerId: "c2", ExecId: "tty", Data: []byte("hello\n")}); err != nil {
			t.Fatal(err)
		}
		out := first + readAll(t, ctx, c, "c2", "tty", agentapi.Stream_STREAM_STDOUT)
		w, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "c2", ExecId: "tty"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "isatty\r\n") || !strings.Contains(out, "40 100\r\n") || !strings.Contains(out, "got hello\r\n") || w.ExitStatus != 0 {
			t.Fatalf("tty output %q exit %d", out, w.ExitStatus)
		}
	})

	t.Run("Stdin", func(t *testing.T) {
		_, err := c.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "cat", Stdin: true, Stdout: true,
			ProcessJson: mustJSON(t, &specs.Process{Args: []string{"cat"}, Env: []string{"PATH=/bin"}, Cwd: "/"})})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "c2", ExecId: "cat"}); err != nil {
			t.Fatal(err)
		}
		c.WriteStdin(ctx, &agentapi.WriteStdinRequest{ContainerId: "c2", ExecId: "cat", Data: []byte("ping\n")})
		if _, err := c.CloseStdin(ctx, &agentapi.CloseStdinRequest{ContainerId: "c2", ExecId: "cat"}); err != nil {
			t.Fatal(err)
		}
		if out := readAll(t, ctx, c, "c2", "cat", agentapi.Stream_STREAM_STDOUT); out != "ping\n" {
			t.Fatalf("cat echoed %q", out)
		}
	})

	t.Run("Signal", func(t *testing.T) {
		_, err := c.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "sleeper",
			ProcessJson: mustJSON(t, &specs.Process{Args: []string{"sleep", "1000"}, Env: []string{"PATH=/bin"}, Cwd: "/"})})
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "c2", ExecId: "sleeper"})
		if err != nil {
			t.Fatal(err)
		}
		pids, err := c.ListPids(ctx, &agentapi.ListPidsRequest{ContainerId: "c2"})
		if err != nil {
			t.Fatal(err)
		}
		found := map[uint32]string{}
		for _, p := range pids.Processes {
			found[p.Pid] = p.ExecId
		}
		if id, ok := found[st.Pid]; !ok || id != "sleeper" {
			t.Errorf("ListPids %v lacks sleeper pid %d", found, st.Pid)
		}
		if _, ok := found[init.Pid]; !ok {
			t.Errorf("ListPids %v lacks init pid %d", found, init.Pid)
		}
		if _, err := c.SignalProcess(ctx, &agentapi.SignalProcessRequest{ContainerId: "c2", ExecId: "sleeper", Signal: uint32(unix.SIGTERM)}); err != nil {
			t.Fatal(err)
		}
		w, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "c2", ExecId: "sleeper"})
		if err != nil {
			t.Fatal(err)
		}
		if w.ExitStatus != 128+15 {
			t.Fatalf("exit %d after SIGTERM, want 143", w.ExitStatus)
		}
		if _, err := c.SignalProcess(ctx, &agentapi.SignalProcessRequest{ContainerId: "c2", ExecId: "sleeper", Signal: 9}); !errdefs.IsNotFound(err) {
			t.Fatalf("signal after exit: %v, want not found", err)
		}
	})

	t.Run("Stats", func(t *testing.T) {
		r, err := c.Stats(ctx, &agentapi.StatsRequest{ContainerId: "c2"})
		if err != nil {
			t.Fatal(err)
		}
		var m stats.Metrics
		if err := r.Metrics.UnmarshalTo(&m); err != nil {
			t.Fatalf("metrics %s: %v", r.Metrics.TypeUrl, err)
		}
		if m.Memory == nil || m.Memory.Usage == 0 || m.Pids == nil || m.Pids.Current == 0 {
			t.Fatalf("metrics without memory or pids: %v", &m)
		}
	})

	t.Run("Network", func(t *testing.T) {
		if _, err := c.UpdateInterface(ctx, &agentapi.UpdateInterfaceRequest{Mac: testMAC, Name: "eth0", Addresses: []string{"10.88.0.5/16"}, Mtu: 1400}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.UpdateRoutes(ctx, &agentapi.UpdateRoutesRequest{Routes: []*agentapi.Route{
			{Gateway: "10.88.0.1"}, {Destination: "192.168.7.0/24", Device: "eth0"},
		}}); err != nil {
			t.Fatal(err)
		}
		out, _ := runExec(t, ctx, c, "c2", "ip1", "sh", "-c", "ip addr show eth0; ip route")
		for _, want := range []string{"mtu 1400", "inet 10.88.0.5/16", "default via 10.88.0.1 dev eth0", "192.168.7.0/24 dev eth0"} {
			if !strings.Contains(out, want) {
				t.Fatalf("network config lacks %q:\n%s", want, out)
			}
		}
		// a restored clone gets a new identity: the old address and routes go
		if _, err := c.UpdateInterface(ctx, &agentapi.UpdateInterfaceRequest{Mac: testMAC, Addresses: []string{"10.99.0.7/16"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.UpdateRoutes(ctx, &agentapi.UpdateRoutesRequest{Routes: []*agentapi.Route{{Gateway: "10.99.0.1"}}}); err != nil {
			t.Fatal(err)
		}
		out, _ = runExec(t, ctx, c, "c2", "ip2", "sh", "-c", "ip addr show eth0; ip route")
		if !strings.Contains(out, "inet 10.99.0.7/16") || strings.Contains(out, "10.88.0.5") || !strings.Contains(out, "default via 10.99.0.1") || strings.Contains(out, "192.168.7.0") {
			t.Fatalf("network after update:\n%s", out)
		}
		// a MAC no NIC has: the only NIC takes it, as a restored clone's
		// takes its new pod's; then it goes back
		for _, mac := range []string{"02:00:00:00:00:99", testMAC} {
			if _, err := c.UpdateInterface(ctx, &agentapi.UpdateInterfaceRequest{Mac: mac}); err != nil {
				t.Fatalf("give the nic mac %s: %v", mac, err)
			}
			if out, _ := runExec(t, ctx, c, "c2", "mac-"+mac[len(mac)-2:], "cat", "/sys/class/net/eth0/address"); strings.TrimSpace(out) != mac {
				t.Fatalf("nic mac after the update = %q, want %s", out, mac)
			}
		}
	})

	t.Run("Hook", func(t *testing.T) {
		r, err := c.RunHook(ctx, &agentapi.RunHookRequest{ContainerId: "c2", Argv: []string{"sh", "-c", "echo out; echo err >&2; cat /tmp/host; exit 5"}})
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Output) != "out\nerr\nc2host\n" || r.ExitStatus != 5 {
			t.Fatalf("hook: %q exit %d", r.Output, r.ExitStatus)
		}
		t0 := time.Now()
		r, err = c.RunHook(ctx, &agentapi.RunHookRequest{ContainerId: "c2", Argv: []string{"sleep", "100"}, Timeout: durationpb.New(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		if r.ExitStatus != 137 || time.Since(t0) > 20*time.Second {
			t.Fatalf("hook timeout: exit %d after %v", r.ExitStatus, time.Since(t0))
		}
	})

	t.Run("NoZombies", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			runExec(t, ctx, c, "c2", "short"+string(rune('0'+i)), "true")
		}
		out, _ := runExec(t, ctx, c, "c2", "ps", "ps", "-o", "pid,stat,comm")
		for _, l := range strings.Split(out, "\n")[1:] {
			if f := strings.Fields(l); len(f) >= 2 && strings.HasPrefix(f[1], "Z") {
				t.Fatalf("zombie in container:\n%s", out)
			}
		}
	})

	t.Run("Reconnect", func(t *testing.T) {
		// A long poll is in flight when the host goes away.
		old := vm.dial(t)
		waitErr := make(chan error, 1)
		go func() {
			_, err := old.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "c2"})
			waitErr <- err
		}()
		time.Sleep(200 * time.Millisecond)
		c.Close()
		old.Close()
		if err := <-waitErr; err == nil {
			t.Fatal("wait survived closing its client")
		}
		for i := 0; i < 3; i++ {
			c = vm.dial(top) // at once: the guest may never see the old host close
			r, err := c.Ping(ctx, &agentapi.PingRequest{})
			if err != nil {
				t.Fatalf("ping after reconnect %d: %v", i, err)
			}
			if r.BootId != bootID {
				t.Fatalf("boot id changed: %s -> %s", bootID, r.BootId)
			}
			if i < 2 {
				c.Close()
			}
		}
		// After a pause long enough for the guest to see EOF, too.
		c.Close()
		time.Sleep(300 * time.Millisecond)
		c = vm.dial(top)
		if out, st := runExec(t, ctx, c, "c2", "after", "cat", "/tmp/host"); out != "c2host\n" || st != 0 {
			t.Fatalf("exec after reconnect: %q %d", out, st)
		}
	})

	t.Run("KillAllAndRemove", func(t *testing.T) {
		if _, err := c.SignalProcess(ctx, &agentapi.SignalProcessRequest{ContainerId: "c2", All: true, Signal: 9}); err != nil {
			t.Fatal(err)
		}
		w, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "c2"})
		if err != nil {
			t.Fatal(err)
		}
		if w.ExitStatus != 137 {
			t.Fatalf("init exit %d after kill all, want 137", w.ExitStatus)
		}
		if _, err := c.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{Id: "c2"}); err != nil {
			t.Fatal(err)
		}
		// the disk is free again: a new container can mount it
		spec := testSpec("cat", "/tmp/host")
		if _, err := c.CreateContainer(ctx, &agentapi.CreateContainerRequest{Id: "c3", SpecJson: mustJSON(t, spec), Rootfs: &agentapi.Rootfs{Serial: "rootfs1"}, Stdout: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "c3"}); err != nil {
			t.Fatal(err)
		}
		if out := readAll(t, ctx, c, "c3", "", agentapi.Stream_STREAM_STDOUT); out != "c2host\n" {
			t.Fatalf("c3 read %q", out)
		}
		if _, err := c.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{Id: "c3"}); err != nil {
			t.Fatal(err)
		}
	})

	// A container made in another's pid namespace (a shareProcessNamespace
	// pod's, a debug container's) is not PID 1 there: when its init exits,
	// the agent ends the rest of it before the exit is reported, as runc's
	// shim does, where the kernel would do it for a PID 1.
	t.Run("SharedPidNamespaceEndsWithInit", func(t *testing.T) {
		mustRun(t, ctx, c, &agentapi.CreateContainerRequest{Id: "owner", SpecJson: mustJSON(t, testSpec("sleep", "100000")), Rootfs: &agentapi.Rootfs{Serial: "rootfs0"}})
		mustRun(t, ctx, c, &agentapi.CreateContainerRequest{Id: "member", PidContainer: "owner", Rootfs: &agentapi.Rootfs{Serial: "rootfs1"},
			SpecJson: mustJSON(t, testSpec("sh", "-c", `sleep 1003 & while [ "$(cat /proc/$!/comm)" != sleep ]; do sleep 0.1; done; exit 3`))})
		w, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "member"})
		if err != nil || w.ExitStatus != 3 {
			t.Fatalf("member's init: exit %v, %v; want 3", w, err)
		}
		// A killed orphan of the owner's sleep stays a zombie, which ps
		// shows as [sleep]: only a live one shows its arguments.
		if out, _ := runExec(t, ctx, c, "owner", "ps", "ps"); strings.Contains(out, "sleep 1003") {
			t.Fatalf("the member's background sleep 1003 outlived its init:\n%s", out)
		}
		for _, id := range []string{"member", "owner"} {
			if _, err := c.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{Id: id}); err != nil {
				t.Fatalf("remove %s: %v", id, err)
			}
		}
	})

	t.Run("CheckpointRestore", func(t *testing.T) {
		spec := testSpec("sh", "-c", `echo before > /tmp/state; exec sleep 100000`)
		if _, err := c.CreateContainer(ctx, &agentapi.CreateContainerRequest{Id: "c4", SpecJson: mustJSON(t, spec), Rootfs: &agentapi.Rootfs{Serial: "rootfs0"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartProcess(ctx, &agentapi.StartProcessRequest{ContainerId: "c4"}); err != nil {
			t.Fatal(err)
		}
		before, err := c.Ping(ctx, &agentapi.PingRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// the old host has a long poll in flight when the VM is saved
		waitErr := make(chan error, 1)
		go func() {
			_, err := c.WaitProcess(ctx, &agentapi.WaitProcessRequest{ContainerId: "c4"})
			waitErr <- err
		}()
		time.Sleep(200 * time.Millisecond)
		state := filepath.Join(vm.dir, "state")
		vm.checkpoint(t, state)
		select {
		case err := <-waitErr:
			if err == nil {
				t.Fatal("wait returned without error after its VM quit")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("long poll still blocked after its VM quit")
		}
		t0 := time.Now()
		vm = vm.restore(top, state, "restore") // the restored VM outlives this subtest
		c = vm.dial(top)
		after, err := c.Ping(ctx, &agentapi.PingRequest{})
		if err != nil {
			t.Fatalf("ping after restore: %v", err)
		}
		t.Logf("agent answered %v after the restore started", time.Since(t0))
		if after.BootId != before.BootId || after.Uptime.AsDuration() < before.Uptime.AsDuration() {
			t.Fatalf("restored guest: boot %s uptime %v, before boot %s uptime %v", after.BootId, after.Uptime.AsDuration(), before.BootId, before.Uptime.AsDuration())
		}
		if out, st := runExec(t, ctx, c, "c4", "after-restore", "cat", "/tmp/state"); out != "before\n" || st != 0 {
			t.Fatalf("exec after restore: %q %d", out, st)
		}
		entropy := make([]byte, 64)
		rand.Read(entropy)
		if _, err := c.Reseed(ctx, &agentapi.ReseedRequest{Entropy: entropy}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Reseed(ctx, &agentapi.ReseedRequest{Entropy: entropy[:8]}); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("reseed with 8 bytes: %v", err)
		}
		now := time.Now().Add(time.Hour)
		if _, err := c.SetTime(ctx, &agentapi.SetTimeRequest{UnixNanos: now.UnixNano()}); err != nil {
			t.Fatal(err)
		}
		out, _ := runExec(t, ctx, c, "c4", "date", "date", "+%s")
		if secs, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64); secs < now.Unix()-30 || secs > now.Unix()+30 {
			t.Fatalf("guest clock %q after SetTime(%d)", out, now.Unix())
		}
		if _, err := c.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{Id: "c4"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("SyncAndShutdown", func(t *testing.T) {
		if _, err := c.Sync(ctx, &agentapi.SyncRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Shutdown(ctx, &agentapi.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-vm.exited:
			vm.exited <- nil // for the cleanup
		case <-time.After(30 * time.Second):
			t.Fatal("VM still running 30s after Shutdown")
		}
	})
}
