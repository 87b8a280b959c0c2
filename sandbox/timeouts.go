package sandbox

import "time"

// The sandbox's own bounds, in one place. What the node config sets
// ([agent] request_timeout, [restore] page_timeout, [stores]
// download_deadline) is not here; docs/timeouts.md lists both.
const (
	// defaultAgentTimeout bounds each short agent call when the config
	// sets no [agent] request_timeout.
	defaultAgentTimeout = 30 * time.Second
	// agentPingTimeout bounds one ping of a guest agent that is starting:
	// the dial loop tries again after it.
	agentPingTimeout = 5 * time.Second
	// stopTimeout bounds Stop: QMP quit, then SIGKILL.
	stopTimeout = 3 * time.Second
	// shutdownTimeout bounds Shutdown's stop of the VM.
	shutdownTimeout = 15 * time.Second
	// failedStartTimeout bounds the stop of a VM whose boot or restore
	// failed at a later step.
	failedStartTimeout = 10 * time.Second
	// hookTimeout bounds a pre-checkpoint or post-restore hook.
	hookTimeout = 60 * time.Second
	// hostnameTimeout bounds setting a restored container's hostname.
	hostnameTimeout = 10 * time.Second
	// firstCommandTimeout bounds the floor benchmark's first command.
	firstCommandTimeout = 10 * time.Second
	// baseImageWait bounds the wait for another shim that builds the same
	// base image: mkfs of a large layer chain takes seconds, a stuck one
	// must not hold every Create of the node.
	baseImageWait = 2 * time.Minute
	// prefetchDelay is the longest a prefetch waits for the restored
	// sandbox's first request (Interacted) before it starts.
	prefetchDelay = 2 * time.Second
	// stuckGrace is how long a page read may outlive its deadline (a store
	// that ignores cancellation) before QEMU is killed.
	stuckGrace = 5 * time.Second
)
