package guest

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// helperConfig is what the agent hands the helper (the agent binary re-executed
// as the container's init or an exec process) on its config pipe.
type helperConfig struct {
	// Mode is helperInit (set up a new container, then wait for start) or
	// helperExec (join a running container through the namespace files passed).
	Mode string `json:"mode"`
	// Rootfs is the guest path of the mounted root filesystem (init only).
	Rootfs        string        `json:"rootfs,omitempty"`
	ReadonlyRoot  bool          `json:"readonlyRoot,omitempty"`
	Mounts        []mountEntry  `json:"mounts,omitempty"`
	Devices       []deviceEntry `json:"devices,omitempty"`
	Files         []fileEntry   `json:"files,omitempty"`
	MaskedPaths   []string      `json:"maskedPaths,omitempty"`
	ReadonlyPaths []string      `json:"readonlyPaths,omitempty"`
	Hostname      string        `json:"hostname,omitempty"`
	Domainname    string        `json:"domainname,omitempty"`
	// Join are the namespaces (joinable's keys) the init enters from the
	// files at fdJoin on, in this order, instead of new ones (init only).
	Join []string `json:"join,omitempty"`
	// Sysctl are written under /proc/sys once the init is in its
	// namespaces, keyed by their path there (sysctlPath).
	Sysctl  map[string]string `json:"sysctl,omitempty"`
	Process processConfig     `json:"process"`
}

const (
	helperInit = "init"
	helperExec = "exec"
)

type mountEntry struct {
	Source string `json:"source"`
	Target string `json:"target"` // inside the container
	FSType string `json:"fstype"`
	Flags  uintptr
	Data   string `json:"data,omitempty"`
	// Copy is set for a bind mount of the host whose content the host sent:
	// the helper bind-mounts the copy at Target, then applies Flags.
	Copy *copiedMount `json:"copy,omitempty"`
	// PodShm is the pod's /dev/shm: once the agent has made the pod's tmpfs
	// (FSType and Data) and set Source to it, the helper bind-mounts it.
	PodShm bool `json:"podShm,omitempty"`
}

// copiedMount is the content of a bind mount copied from the host.
type copiedMount struct {
	// File: the mount is one file (Files[0], Path ""), not a directory.
	File bool `json:"file,omitempty"`
	// Files' paths are relative to the mount's target.
	Files []fileEntry `json:"files,omitempty"`
}

type deviceEntry struct {
	Path  string `json:"path"`
	Type  string `json:"type"` // c, b, p
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
	Mode  uint32 `json:"mode"`
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
}

// fileEntry is a file the host copied in, or, Dir set, a directory of a
// copied mount: its permission bits (07777) and owner are the host's.
type fileEntry struct {
	Path    string `json:"path"`
	Content []byte `json:"content"`
	Mode    uint32 `json:"mode"`
	UID     uint32 `json:"uid,omitempty"`
	GID     uint32 `json:"gid,omitempty"`
	Dir     bool   `json:"dir,omitempty"`
}

type rlimit struct {
	Resource int    `json:"resource"`
	Soft     uint64 `json:"soft"`
	Hard     uint64 `json:"hard"`
}

type processConfig struct {
	Args            []string `json:"args"`
	Env             []string `json:"env,omitempty"`
	Cwd             string   `json:"cwd"`
	UID             uint32   `json:"uid"`
	GID             uint32   `json:"gid"`
	AdditionalGids  []uint32 `json:"additionalGids,omitempty"`
	Umask           *uint32  `json:"umask,omitempty"`
	Rlimits         []rlimit `json:"rlimits,omitempty"`
	NoNewPrivileges bool     `json:"noNewPrivileges,omitempty"`
	// Capabilities, nil: keep all (root) / none (other users).
	Capabilities *specs.LinuxCapabilities `json:"capabilities,omitempty"`
	OOMScoreAdj  *int                     `json:"oomScoreAdj,omitempty"`
}

// defaultDevices are created in every container's /dev, as runc does.
var defaultDevices = []deviceEntry{
	{Path: "/dev/null", Type: "c", Major: 1, Minor: 3, Mode: 0o666},
	{Path: "/dev/zero", Type: "c", Major: 1, Minor: 5, Mode: 0o666},
	{Path: "/dev/full", Type: "c", Major: 1, Minor: 7, Mode: 0o666},
	{Path: "/dev/random", Type: "c", Major: 1, Minor: 8, Mode: 0o666},
	{Path: "/dev/urandom", Type: "c", Major: 1, Minor: 9, Mode: 0o666},
	{Path: "/dev/tty", Type: "c", Major: 5, Minor: 0, Mode: 0o666},
}

// joinable are the namespaces a container's helper enters from another
// container's init instead of new ones: a pod's containers share its
// sandbox container's IPC and UTS namespaces, as under runc. A pid
// namespace is not entered but made in (ContainerConfig.PidContainer): it
// is the helper's parent that must be in it.
var joinable = map[string]uintptr{"ipc": unix.CLONE_NEWIPC, "uts": unix.CLONE_NEWUTS}

// containerNamespaces are the clone flags for a new container's init: new
// mount, pid, uts and ipc namespaces, but for those in join, which the init
// enters instead. Network (and time, user) stay the VM's: the VM is the
// isolation boundary and owns the pod's interface.
func containerNamespaces(spec *specs.Spec, join []string) (uintptr, error) {
	flags := uintptr(unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC)
	for i, ns := range join {
		f, ok := joinable[ns]
		if !ok || slices.Contains(join[:i], ns) {
			return 0, fmt.Errorf("joining namespace %q of another container is not supported", ns)
		}
		flags &^= f
	}
	if spec.Linux == nil {
		return flags, nil
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Path != "" && ns.Type != specs.NetworkNamespace {
			return 0, fmt.Errorf("joining namespace %s at %s is not supported in the guest", ns.Type, ns.Path)
		}
		if ns.Type == specs.CgroupNamespace {
			flags |= unix.CLONE_NEWCGROUP
		}
	}
	return flags, nil
}

// translateSpec turns a container's OCI spec into the helper's config for its
// init process. files are the host files copied in; a bind mount whose
// destination is one of them is satisfied by the copy. Mounts that cannot be
// done in the guest are returned as skipped, for the caller to log.
func translateSpec(spec *specs.Spec, rootfs string, files []fileEntry) (*helperConfig, []string, error) {
	if spec.Process == nil {
		return nil, nil, fmt.Errorf("spec has no process")
	}
	proc, err := translateProcess(spec.Process)
	if err != nil {
		return nil, nil, err
	}
	cfg := &helperConfig{
		Mode:       helperInit,
		Rootfs:     rootfs,
		Hostname:   spec.Hostname,
		Domainname: spec.Domainname,
		Process:    *proc,
		Devices:    append([]deviceEntry(nil), defaultDevices...),
	}
	if spec.Root != nil {
		cfg.ReadonlyRoot = spec.Root.Readonly
	}
	var skipped []string
	for i, m := range spec.Mounts {
		e, skip, err := translateMount(m)
		if err != nil {
			return nil, nil, fmt.Errorf("mounts[%d] (%s): %w", i, m.Destination, err)
		}
		if skip != "" {
			skipped = append(skipped, skip)
			continue
		}
		cfg.Mounts = append(cfg.Mounts, *e)
	}
	cfg.Files = assignCopies(cfg.Mounts, files)
	cfg.Mounts, skipped = dropUnsent(cfg.Mounts, rootfs, skipped)
	if l := spec.Linux; l != nil {
		cfg.MaskedPaths, cfg.ReadonlyPaths = l.MaskedPaths, l.ReadonlyPaths
		if cfg.Sysctl, err = sysctlPaths(l.Sysctl); err != nil {
			return nil, nil, err
		}
		for _, d := range l.Devices {
			e := deviceEntry{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor, Mode: 0o666}
			if d.FileMode != nil {
				e.Mode = uint32(*d.FileMode)
			}
			if d.UID != nil {
				e.UID = *d.UID
			}
			if d.GID != nil {
				e.GID = *d.GID
			}
			cfg.Devices = append(cfg.Devices, e)
		}
	}
	return cfg, skipped, nil
}

// translateMount returns the mount to make, or why it is skipped. Every
// bind mount but /dev/shm is one the host copied (the shim drops the others):
// its content comes with the files, see assignCopies.
func translateMount(m specs.Mount) (*mountEntry, string, error) {
	dst := path.Clean(m.Destination)
	if !path.IsAbs(dst) {
		return nil, fmt.Sprintf("mount %s: destination is not absolute", m.Destination), nil
	}
	flags, data, bind := parseMountOptions(m.Options)
	typ := m.Type
	if typ == "bind" || bind {
		flags, err := bindFlags(m.Options)
		switch {
		case err != nil:
			return nil, "", err
		case dst == "/dev/shm":
			// the pod's shared memory: one tmpfs of the VM for all its
			// containers (PodShm), as CRI's sandbox shm is on the host
			return &mountEntry{Source: "shm", Target: dst, FSType: "tmpfs", Flags: flags | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: "mode=1777,size=65536k", PodShm: true}, "", nil
		case dst == "/":
			return nil, "", fmt.Errorf("a bind mount onto / is not supported")
		default:
			return &mountEntry{Target: dst, Flags: flags, Copy: &copiedMount{}}, "", nil
		}
	}
	switch typ {
	case "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup2", "ramfs":
	case "cgroup":
		typ = "cgroup2" // the guest has cgroup v2 only
		data = ""
	case "":
		return nil, fmt.Sprintf("mount %s: no type", dst), nil
	default:
		return nil, fmt.Sprintf("mount %s: type %q is not supported in the guest", dst, typ), nil
	}
	src := m.Source
	if src == "" {
		src = typ
	}
	return &mountEntry{Source: src, Target: dst, FSType: typ, Flags: flags, Data: data}, "", nil
}

// bindFlags are the per-mount flags a bind mount's options ask for. The
// options come from the spec, untrusted: anything but the flags a bind
// mount's remount can set is refused, rather than silently dropped. The
// recursive forms (rro, ...) are the same as the plain ones here: a copied
// mount has no submounts of its own.
func bindFlags(opts []string) (uintptr, error) {
	var flags uintptr
	for _, o := range opts {
		name := o
		if strings.HasPrefix(o, "r") && bindFlagNames[o[1:]] {
			name = o[1:]
		}
		f, ok := mountFlags[name]
		switch {
		case ok && bindFlagNames[name]:
			if f.clear {
				flags &^= f.flag
			} else {
				flags |= f.flag
			}
		case o == "bind" || o == "rbind" || propagationOptions[o]:
		default:
			return 0, fmt.Errorf("option %q is not supported on a bind mount", o)
		}
	}
	return flags, nil
}

// bindFlagNames are the options of mountFlags that a bind remount applies.
var bindFlagNames = map[string]bool{
	"ro": true, "rw": true, "nosuid": true, "suid": true, "nodev": true, "dev": true,
	"noexec": true, "exec": true, "noatime": true, "atime": true, "nodiratime": true,
	"diratime": true, "relatime": true, "norelatime": true, "strictatime": true, "nostrictatime": true,
}

// dropUnsent skips the copied mounts that got no files and whose target in
// the root is not a directory: the host sent no content for them (an empty
// directory it copied has a directory to go on).
func dropUnsent(mounts []mountEntry, rootfs string, skipped []string) ([]mountEntry, []string) {
	kept := mounts[:0]
	for _, m := range mounts {
		if m.Copy != nil && len(m.Copy.Files) == 0 {
			if dst, err := securePath(rootfs, m.Target); err == nil {
				if fi, err := os.Stat(dst); err == nil && !fi.IsDir() {
					skipped = append(skipped, fmt.Sprintf("bind mount %s: the host sent no content for it", m.Target))
					continue
				}
			}
		}
		kept = append(kept, m)
	}
	return kept, skipped
}

// assignCopies gives each copied mount its files: the one at its target, or
// those under it, the longest target winning for nested mounts. The files
// no mount claims are returned, to be written into the root as they are.
func assignCopies(mounts []mountEntry, files []fileEntry) []fileEntry {
	var rest []fileEntry
	for _, f := range files {
		p := path.Clean(f.Path)
		owner := -1
		for i, m := range mounts {
			if m.Copy == nil || p != m.Target && !strings.HasPrefix(p, m.Target+"/") {
				continue
			}
			if owner < 0 || len(m.Target) > len(mounts[owner].Target) {
				owner = i
			}
		}
		if owner < 0 {
			if !f.Dir { // a directory is only a copied mount's
				rest = append(rest, f)
			}
			continue
		}
		c := mounts[owner].Copy
		rel := strings.TrimPrefix(strings.TrimPrefix(p, mounts[owner].Target), "/")
		c.File = c.File || rel == "" && !f.Dir
		f.Path = rel
		c.Files = append(c.Files, f)
	}
	return rest
}

var mountFlags = map[string]struct {
	clear bool
	flag  uintptr
}{
	"ro": {false, unix.MS_RDONLY}, "rw": {true, unix.MS_RDONLY},
	"nosuid": {false, unix.MS_NOSUID}, "suid": {true, unix.MS_NOSUID},
	"nodev": {false, unix.MS_NODEV}, "dev": {true, unix.MS_NODEV},
	"noexec": {false, unix.MS_NOEXEC}, "exec": {true, unix.MS_NOEXEC},
	"sync": {false, unix.MS_SYNCHRONOUS}, "async": {true, unix.MS_SYNCHRONOUS},
	"noatime": {false, unix.MS_NOATIME}, "atime": {true, unix.MS_NOATIME},
	"nodiratime": {false, unix.MS_NODIRATIME}, "diratime": {true, unix.MS_NODIRATIME},
	"relatime": {false, unix.MS_RELATIME}, "norelatime": {true, unix.MS_RELATIME},
	"strictatime": {false, unix.MS_STRICTATIME}, "nostrictatime": {true, unix.MS_STRICTATIME},
	"dirsync": {false, unix.MS_DIRSYNC}, "mand": {false, unix.MS_MANDLOCK}, "nomand": {true, unix.MS_MANDLOCK},
	"remount": {false, unix.MS_REMOUNT},
}

// propagation options are not used for the guest's own mounts.
var propagationOptions = map[string]bool{
	"private": true, "rprivate": true, "shared": true, "rshared": true,
	"slave": true, "rslave": true, "unbindable": true, "runbindable": true,
}

// parseMountOptions splits fstab-style options into flags and filesystem data;
// bind is set for "bind" and "rbind".
func parseMountOptions(opts []string) (flags uintptr, data string, bind bool) {
	var rest []string
	for _, o := range opts {
		if f, ok := mountFlags[o]; ok {
			if f.clear {
				flags &^= f.flag
			} else {
				flags |= f.flag
			}
			continue
		}
		switch {
		case o == "bind" || o == "rbind":
			bind = true
		case propagationOptions[o]:
		default:
			rest = append(rest, o)
		}
	}
	return flags, strings.Join(rest, ","), bind
}

var rlimitNames = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK": unix.RLIMIT_STACK,
}

// translateProcess turns an OCI process into the helper's process config.
func translateProcess(p *specs.Process) (*processConfig, error) {
	if len(p.Args) == 0 {
		return nil, fmt.Errorf("process has no args")
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if !path.IsAbs(cwd) {
		return nil, fmt.Errorf("process cwd %q is not absolute", cwd)
	}
	env := p.Env
	if !hasEnv(env, "PATH") {
		env = append(append([]string(nil), env...), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	pc := &processConfig{
		Args:            p.Args,
		Env:             env,
		Cwd:             cwd,
		UID:             p.User.UID,
		GID:             p.User.GID,
		AdditionalGids:  p.User.AdditionalGids,
		Umask:           p.User.Umask,
		NoNewPrivileges: p.NoNewPrivileges,
		Capabilities:    p.Capabilities,
		OOMScoreAdj:     p.OOMScoreAdj,
	}
	for _, r := range p.Rlimits {
		res, ok := rlimitNames[r.Type]
		if !ok {
			return nil, fmt.Errorf("unknown rlimit %q", r.Type)
		}
		pc.Rlimits = append(pc.Rlimits, rlimit{Resource: res, Soft: r.Soft, Hard: r.Hard})
	}
	return pc, nil
}

func hasEnv(env []string, name string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, name+"=") {
			return true
		}
	}
	return false
}

// sysctlPaths are a spec's sysctls keyed by their path under /proc/sys.
// Every sysctl is applied, namespaced or not, as the VM is the pod's
// alone (kubelet decides which a pod may ask for); but a key is a path
// only below /proc/sys.
func sysctlPaths(sysctl map[string]string) (map[string]string, error) {
	if len(sysctl) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(sysctl))
	for k, v := range sysctl {
		p, err := sysctlPath(k)
		if err != nil {
			return nil, err
		}
		out[p] = v
	}
	return out, nil
}

// sysctlPath is the path of sysctl key below /proc/sys. A key separated by
// dots has its dots turned into slashes; one with a slash is a path already,
// its dots kept (sysctl(8)'s rule, which Kubernetes follows for names such
// as net/ipv4/conf/eth0.100/forwarding).
func sysctlPath(key string) (string, error) {
	p := key
	if !strings.Contains(key, "/") {
		p = strings.ReplaceAll(key, ".", "/")
	}
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." || strings.ContainsRune(part, 0) {
			return "", fmt.Errorf("linux.sysctl %q: not a sysctl name", key)
		}
	}
	return p, nil
}
