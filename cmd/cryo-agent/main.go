// cryo-agent is the guest's PID 1 (/init in the initrd): it serves the agent API
// on the virtio-serial port "agent.0". Run as "cryo-agent container-helper" it
// is the short-lived helper that becomes a container's process.
package main

import (
	"context"
	"os"
	"time"

	"github.com/containerd/log"

	"github.com/cryo-runtime/cryo/agent/guest"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == guest.HelperArg {
		guest.RunHelper() // does not return
	}
	ctx := context.Background()
	err := guest.Run(ctx)
	// PID 1 must not exit (the kernel would panic): power off instead.
	log.G(ctx).WithError(err).Error("cryo-agent stopped")
	time.Sleep(time.Second)
	guest.PowerOff()
	select {}
}
