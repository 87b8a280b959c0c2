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
	// The shim's children are QEMU and short-lived tools (qemu-img,
	// mkfs.ext4) that it waits for itself: containerd's reaper, which reaps
	// every child, would steal their exit statuses. Container processes live
	// in the guest, so the shim needs neither the reaper nor to be a
	// subreaper.
	shim.RunShim(context.Background(), cryoshim.NewManager(cryoshim.RuntimeName), func(c *shim.Config) {
		c.NoReaper, c.NoSubreaper = true, true
	})
}
