package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// container is one container of the sandbox: its root disk mount, cgroup and
// processes.
type container struct {
	id     string
	dir    string // <state>/<id>
	rootfs string // <dir>/rootfs, the mounted root disk
	cgPath string // absolute path of the container's cgroup
	cg     *cgroup2.Manager
	cgDir  *os.File // for CLONE_INTO_CGROUP
	init   *process
	oom    *oomCount

	mu    sync.Mutex
	execs map[string]*process
}

// ContainerConfig is a CreateContainer request, decoded.
type ContainerConfig struct {
	ID         string
	Spec       *specs.Spec
	DiskSerial string
	FSType     string
	Options    []string
	Files      []fileEntry
	Stdio      StdioConfig
	// Join are namespaces (joinable's keys) to take from the init of
	// container JoinContainer instead of new ones.
	JoinContainer string
	Join          []string
	// PidContainer, when set, names the container in whose init's pid
	// namespace the init is made, instead of a new one.
	PidContainer string
}

// validID keeps ids usable as path components and cgroup names.
func validID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
		return fmt.Errorf("container id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// createContainer mounts the root disk, creates the cgroup and the init
// process (which waits for start). Everything is undone on failure.
func (s *Service) createContainer(ctx context.Context, cc *ContainerConfig) (_ *container, retErr error) {
	c := &container{id: cc.ID, dir: filepath.Join(s.stateDir, cc.ID), execs: map[string]*process{}}
	c.rootfs = filepath.Join(c.dir, "rootfs")
	defer func() {
		if retErr != nil {
			c.cleanup(ctx)
		}
	}()
	if err := os.MkdirAll(c.rootfs, 0o711); err != nil {
		return nil, err
	}
	dev, err := findDisk(ctx, s.sysBlock, s.devDir, cc.DiskSerial, s.diskTimeout)
	if err != nil {
		return nil, err
	}
	fstype := cc.FSType
	if fstype == "" {
		fstype = "ext4"
	}
	flags, data, _ := parseMountOptions(cc.Options)
	if err := unix.Mount(dev, c.rootfs, fstype, flags, data); err != nil {
		return nil, fmt.Errorf("mount %s (serial %s) on %s: %w", dev, cc.DiskSerial, c.rootfs, err)
	}
	if err := c.createCgroup(s.cgroupRoot, cc.Spec); err != nil {
		return nil, err
	}
	cfg, skipped, err := translateSpec(cc.Spec, c.rootfs, cc.Files)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	for _, m := range skipped {
		log.G(ctx).WithField("id", c.id).Warn("skipping " + m)
	}
	if err := s.sharePodShm(cfg.Mounts); err != nil {
		return nil, err
	}
	flagsNS, err := containerNamespaces(cc.Spec, cc.Join)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrNotImplemented)
	}
	joined, err := s.podNamespaces(cc)
	if err != nil {
		return nil, err
	}
	defer closeAll(joined)
	pidNS, err := s.sharedPidNamespace(cc)
	if err != nil {
		return nil, err
	}
	if pidNS != nil {
		defer pidNS.Close()
		flagsNS &^= unix.CLONE_NEWPID
	}
	cfg.Join = cc.Join
	p := newProcess("", cfg, cc.Stdio)
	startR, startW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer startR.Close()
	p.start = startW
	// PID 1 of its own pid namespace, to which the kernel drops unhandled
	// signals (signal.go); in another's, an ordinary process.
	p.init, p.nsInit = true, pidNS == nil
	if !p.nsInit {
		// As runc's shim does for a container whose pid namespace is
		// shared: the kernel ends the rest only with a namespace's PID 1.
		p.killRest = c.cg.Kill
	}
	c.init = p
	if err := p.spawn(s.reaper, spawnOpts{cloneflags: flagsNS, cgroupFD: int(c.cgDir.Fd()), extra: append([]*os.File{startR}, joined...), pidNS: pidNS}); err != nil {
		return nil, err
	}
	ready, err := p.readStatus(ctx)
	if err == nil && !ready {
		err = errors.New("helper exited before it was ready")
	}
	if err != nil {
		return nil, fmt.Errorf("set up container %s: %w", c.id, err)
	}
	// Watched once the container exists: its init runs nothing before
	// start.
	c.oom = newOOMCount()
	go c.watchOOM()
	return c, nil
}

// podNamespaces opens the namespaces cc joins, those of the init of
// container cc.JoinContainer (the pod's sandbox container), in cc.Join's
// order. That init must still run: its namespaces are the pod's.
func (s *Service) podNamespaces(cc *ContainerConfig) (_ []*os.File, retErr error) {
	if len(cc.Join) == 0 {
		return nil, nil
	}
	pid, err := s.runningInit(cc.JoinContainer)
	if err != nil {
		return nil, fmt.Errorf("join the namespaces of container %q: %w", cc.JoinContainer, err)
	}
	var files []*os.File
	defer func() {
		if retErr != nil {
			closeAll(files)
		}
	}()
	for _, ns := range cc.Join {
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil {
			return nil, fmt.Errorf("join the %s namespace of container %q: %w", ns, cc.JoinContainer, err)
		}
		files = append(files, f)
	}
	return files, nil
}

// sharedPidNamespace opens the pid namespace cc's init is made in, that of
// the init of container cc.PidContainer (nil: a new one). That init must
// still run: were it gone, its namespace would take no new process.
func (s *Service) sharedPidNamespace(cc *ContainerConfig) (*os.File, error) {
	if cc.PidContainer == "" {
		return nil, nil
	}
	pid, err := s.runningInit(cc.PidContainer)
	if err == nil {
		var f *os.File
		if f, err = os.Open(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil {
			return f, nil
		}
	}
	return nil, fmt.Errorf("join the pid namespace of container %q: %w", cc.PidContainer, err)
}

// runningInit is the pid of container id's init, which must still run: the
// namespaces another container joins are held by it.
func (s *Service) runningInit(id string) (int, error) {
	c, err := s.container(id)
	if err != nil {
		return 0, err
	}
	pid := c.init.Pid()
	if pid == 0 || c.init.stateIs(stateStopped) {
		return 0, fmt.Errorf("its init is not running: %w", errdefs.ErrFailedPrecondition)
	}
	return pid, nil
}

// sharePodShm points the pod's /dev/shm mounts at one tmpfs of the VM,
// made at the first: the pod's containers share their POSIX shared memory
// as they do under runc, where each bind-mounts the sandbox's. It is made
// from the first such mount's options (CRI sends the same for each) and
// lives as long as the VM.
func (s *Service) sharePodShm(mounts []mountEntry) error {
	for i := range mounts {
		m := &mounts[i]
		if !m.PodShm {
			continue
		}
		s.mu.Lock()
		err := s.makePodShm(m)
		s.mu.Unlock()
		if err != nil {
			return err
		}
		m.Source = s.podShm
	}
	return nil
}

// makePodShm mounts the pod's shared memory once; s.mu is held.
func (s *Service) makePodShm(m *mountEntry) error {
	if s.podShm != "" {
		return nil
	}
	dir := filepath.Join(filepath.Dir(s.stateDir), "shm")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("shm", dir, m.FSType, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, m.Data); err != nil {
		return fmt.Errorf("make the pod's shared memory (%s): %w", dir, err)
	}
	s.podShm = dir
	return nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

func (c *container) createCgroup(root string, spec *specs.Spec) error {
	res := &cgroup2.Resources{}
	if spec.Linux != nil && spec.Linux.Resources != nil {
		res = cgroup2.ToResources(spec.Linux.Resources)
		// The device cgroup (an eBPF filter) buys nothing inside the VM.
		res.Devices = nil
	}
	group := "/cryo/" + c.id
	m, err := cgroup2.NewManager(root, group, res)
	if err != nil {
		return fmt.Errorf("create cgroup %s: %w", group, err)
	}
	c.cg, c.cgPath = m, filepath.Join(root, group)
	c.cgDir, err = os.Open(c.cgPath)
	return err
}

// start runs the init process.
func (c *container) start(ctx context.Context) (int, error) {
	p := c.init
	p.mu.Lock()
	if p.state != stateCreated || p.start == nil {
		p.mu.Unlock()
		return 0, fmt.Errorf("container %s is %s: %w", c.id, p.state, errdefs.ErrFailedPrecondition)
	}
	_, err := p.start.Write([]byte{0})
	p.start.Close()
	p.start = nil
	p.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("start container %s: %w", c.id, err)
	}
	if err := p.started(ctx); err != nil {
		return 0, fmt.Errorf("start container %s: %w", c.id, err)
	}
	return p.Pid(), nil
}

// addExec registers an exec process; it is spawned by startExec.
func (c *container) addExec(id string, cfg *helperConfig, stdio StdioConfig) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.execs[id]; ok || id == "" {
		return fmt.Errorf("exec %q in %s: %w", id, c.id, errdefs.ErrAlreadyExists)
	}
	c.execs[id] = newProcess(id, cfg, stdio)
	return nil
}

func (c *container) process(execID string) (*process, error) {
	if execID == "" {
		return c.init, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.execs[execID]
	if !ok {
		return nil, fmt.Errorf("exec %q in %s: %w", execID, c.id, errdefs.ErrNotFound)
	}
	return p, nil
}

// startExec starts an exec process inside the namespaces of the running init.
func (c *container) startExec(ctx context.Context, r *Reaper, p *process) (int, error) {
	p.mu.Lock()
	if p.state != stateCreated || p.spawned {
		p.mu.Unlock()
		return 0, fmt.Errorf("exec %s was started already: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	p.spawned = true
	p.mu.Unlock()
	initPid := c.init.Pid()
	if c.init.stateIs(stateStopped) {
		return 0, fmt.Errorf("container %s is not running: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, name := range []string{"ns/pid", "ns/mnt", "ns/uts", "ns/ipc", "root"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/%s", initPid, name))
		if err != nil {
			return 0, fmt.Errorf("exec in %s: %w", c.id, err)
		}
		files = append(files, f)
	}
	err := p.spawn(r, spawnOpts{cgroupFD: int(c.cgDir.Fd()), pidNS: files[0], extra: files[1:]})
	if err != nil {
		return 0, err
	}
	if err := p.started(ctx); err != nil {
		return 0, fmt.Errorf("exec %s in %s: %w", p.id, c.id, err)
	}
	return p.Pid(), nil
}

func (p *process) stateIs(s procState) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == s
}

func (c *container) deleteExec(id string) error {
	p, err := c.process(id)
	if err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("the init process goes with its container: %w", errdefs.ErrInvalidArgument)
	}
	if p.Pid() != 0 && !p.stateIs(stateStopped) {
		return fmt.Errorf("exec %s is running: %w", id, errdefs.ErrFailedPrecondition)
	}
	p.closeFiles()
	c.mu.Lock()
	delete(c.execs, id)
	c.mu.Unlock()
	return nil
}

// pids lists the container's processes, naming the ones the agent started.
func (c *container) pids() ([]int, map[int]string, error) {
	procs, err := c.cg.Procs(true)
	if err != nil {
		return nil, nil, err
	}
	names := map[int]string{}
	c.mu.Lock()
	for id, p := range c.execs {
		if pid := p.Pid(); pid != 0 {
			names[pid] = id
		}
	}
	c.mu.Unlock()
	out := make([]int, 0, len(procs))
	for _, p := range procs {
		out = append(out, int(p))
	}
	sort.Ints(out)
	return out, names, nil
}

// signalAll sends sig to every process in the container's cgroup.
func (c *container) signalAll(sig unix.Signal) error {
	if sig == unix.SIGKILL {
		return c.cg.Kill()
	}
	pids, _, err := c.pids()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, sig); err != nil && err != unix.ESRCH {
			return err
		}
	}
	return nil
}

// cleanup kills what is left, unmounts the root disk and removes the cgroup
// and state directory (without recursing: a stuck mount keeps its files).
func (c *container) cleanup(ctx context.Context) error {
	var errs []error
	if c.init != nil {
		c.init.closeFiles() // an init still waiting for start exits
	}
	if c.cg != nil {
		if err := c.cg.Kill(); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("kill cgroup: %w", err))
		}
		if err := waitEmpty(ctx, c.cg, 5*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	c.mu.Lock()
	for _, p := range c.execs {
		p.closeFiles()
	}
	c.mu.Unlock()
	if err := unix.Unmount(c.rootfs, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		errs = append(errs, fmt.Errorf("unmount %s: %w", c.rootfs, err))
	}
	if c.cgDir != nil {
		c.cgDir.Close()
	}
	if c.cg != nil {
		if err := c.cg.Delete(); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	}
	os.Remove(c.rootfs)
	os.Remove(c.dir)
	return errors.Join(errs...)
}

func waitEmpty(ctx context.Context, m *cgroup2.Manager, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		procs, err := m.Procs(true)
		if err != nil || len(procs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup still has %d processes after %v", len(procs), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// decodeSpec parses a spec sent by the host.
func decodeSpec(b []byte) (*specs.Spec, error) {
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decode spec: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return &s, nil
}

// findDisk waits for the virtio-blk disk with the given serial (it may just
// have been hot-plugged) and returns its device node under devDir, once the
// node opens: the disk's sysfs serial appears before the kernel has made
// the disk live, and a mount in between fails with ENXIO.
func findDisk(ctx context.Context, sysBlock, devDir, serial string, timeout time.Duration) (string, error) {
	if serial == "" {
		return "", fmt.Errorf("rootfs disk serial is empty: %w", errdefs.ErrInvalidArgument)
	}
	deadline := time.Now().Add(timeout)
	var notReady error
	for {
		if dev := diskBySerial(sysBlock, devDir, serial); dev != "" {
			if notReady = openable(dev); notReady == nil {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			if notReady != nil {
				return "", fmt.Errorf("disk with serial %q not ready after %v: %w", serial, timeout, notReady)
			}
			return "", fmt.Errorf("no disk with serial %q after %v: %w", serial, timeout, errdefs.ErrNotFound)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// diskBySerial is the device node of the disk whose sysfs serial is
// serial, "" when there is none yet.
func diskBySerial(sysBlock, devDir, serial string) string {
	ms, _ := filepath.Glob(filepath.Join(sysBlock, "*", "serial"))
	for _, m := range ms {
		if b, err := os.ReadFile(m); err == nil && strings.TrimSpace(string(b)) == serial {
			return filepath.Join(devDir, filepath.Base(filepath.Dir(m)))
		}
	}
	return ""
}

// openable opens and closes dev read-only.
func openable(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	return f.Close()
}
