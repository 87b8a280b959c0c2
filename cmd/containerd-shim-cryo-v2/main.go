// Command containerd-shim-cryo-v2 is the containerd shim v2 for runtime type
// io.containerd.cryo.v2: every sandbox is a QEMU virtual machine.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/shim"

	cryoshim "github.com/cryo-runtime/cryo/shim"
	_ "github.com/cryo-runtime/cryo/shim/plugin"
)

func main() {
	// NoReaper: the shim's children (QEMU, qemu-img, mkfs) are waited for by
	// exec.Cmd; a SIGCHLD reaper would steal their exit statuses
	// ("qemu-img: waitid: no child processes").
	shim.RunShim(context.Background(), cryoshim.NewManager(cryoshim.RuntimeName), func(c *shim.Config) { c.NoReaper = true })
}
