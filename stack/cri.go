package stack

import (
	"fmt"

	"github.com/cryo-runtime/cryo/configs"
)

// CRIConfig is the part of a containerd config (version 3) that serves CRI
// with cryo as the default runtime handler "cryo" and a CNI network. The
// integration tests and hack/demo-cri.sh (through hack/criconfig) both
// write it from here.
type CRIConfig struct {
	PauseImage string
	// RegistryHosts, when set, is the image service's hosts.toml directory.
	RegistryHosts string
	// CryoConfig is the cryo config file the handler passes to the shim.
	CryoConfig string
	// CNIBinDir holds the CNI plugins, CNIConfDir the network list.
	CNIBinDir, CNIConfDir string
	// DrainExecSyncIOTimeout, when set, bounds how long ExecSync waits for
	// the exec's output after the process exits (drain_exec_sync_io_timeout;
	// containerd's own CRI tests run with "10s").
	DrainExecSyncIOTimeout string
	// MaxContainerLogLineSize, when set, is the length at which CRI splits
	// a container's log line (max_container_log_line_size; containerd's
	// default, 16 KiB, when 0).
	MaxContainerLogLineSize int
	// RuncRoot, when set, adds the runtime handler "runc" (runc's own shim,
	// for pods that are not sandboxes, such as the cryo controller) with
	// runc's state in this directory instead of /run/containerd/runc, so
	// that it goes with the stack.
	RuncRoot string
}

// TOML returns the plugin sections, to append to a config's [plugins]. No
// [plugins."io.containerd.runtime.v2.task"] section: in a version 3 config
// it wipes the shim manager's socket_dir.
func (c CRIConfig) TOML() string {
	registry := ""
	if c.RegistryHosts != "" {
		registry = fmt.Sprintf("    [plugins.\"io.containerd.cri.v1.images\".registry]\n      config_path = %q\n", c.RegistryHosts)
	}
	runtimeOpts := ""
	if c.DrainExecSyncIOTimeout != "" {
		runtimeOpts = fmt.Sprintf("    drain_exec_sync_io_timeout = %q\n", c.DrainExecSyncIOTimeout)
	}
	if c.MaxContainerLogLineSize != 0 {
		runtimeOpts += fmt.Sprintf("    max_container_log_line_size = %d\n", c.MaxContainerLogLineSize)
	}
	runc := ""
	if c.RuncRoot != "" {
		runc = fmt.Sprintf(runcHandler, c.RuncRoot)
	}
	return fmt.Sprintf(criConfig, c.PauseImage, registry, runtimeOpts, configs.RuntimeType, c.CryoConfig, runc, c.CNIBinDir, c.CNIConfDir)
}

// runcHandler is the handler "runc": containerd-shim-runc-v2 on
// containerd's PATH, runc on the shim's, cgroupfs (the kubelet's driver).
const runcHandler = `      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          Root = "%s"
          SystemdCgroup = false
`

const criConfig = `  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "%s"
%s
  [plugins."io.containerd.cri.v1.runtime"]
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true
    enable_criu = true
%s    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "cryo"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.cryo]
        runtime_type = "%s"
        pod_annotations = ["cryo.dev/*", "agents.kruise.io/archive-location", "io.katacontainers.restore-from"]
        container_annotations = ["cryo.dev/*"]
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.cryo.options]
          ConfigPath = "%s"
%s    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["%s"]
      conf_dir = "%s"
  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  [plugins."io.containerd.nri.v1.nri"]
    disable = true
`
