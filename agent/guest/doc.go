// Package guest is the guest side of the agent API: cryo-agent, PID 1 of every
// sandbox VM, built from cmd/cryo-agent.
//
// # Boot and transport
//
// Run mounts devtmpfs, /proc, /sys, cgroup2, devpts, /run (shared, see below)
// and /tmp, loads the modules listed in /modules.load with finit_module, brings
// lo up, finds the virtio-serial port named "agent.0" in
// /sys/class/virtio-ports and serves ttrpc on it. The port outlives every host
// connection: package session splits it into one ttrpc connection per host
// session (a hello with a nonce starts one; EOF on the port, which is what a
// read returns while no host is connected, ends one, and the reader backs off
// 10 ms). That makes a reconnecting shim, and a new QEMU process after a
// restore, safe even when the guest never saw the old host go.
//
// # Containers
//
// CreateContainer finds the root disk by its virtio-blk serial
// (/sys/block/*/serial), mounts it at /run/cryo/c/<id>/rootfs, creates the
// cgroup /sys/fs/cgroup/cryo/<id> and starts a helper: the agent binary again
// (/proc/self/exe container-helper), cloned with new mount, pid, uts and ipc
// namespaces straight into the cgroup (CLONE_INTO_CGROUP). A pod's container
// gets no uts and ipc namespaces of its own: the shim names its pod's sandbox
// container, whose init's the helper enters (setns) first, so the pod's
// containers share them, its sysctls and its one /dev/shm (a tmpfs the agent
// makes at the first container that asks) as under runc. The helper mounts
// what the spec asks for. Bind mounts of host paths cannot exist in a VM: the
// host sends the content of those it could copy (the others are gone from the
// spec) and the helper bind-mounts each copy at its target, a read-only one
// from a tmpfs outside the root (it reaches no disk), a writable one from its
// content written into the root; then a bind remount applies the mount's ro,
// nosuid, nodev, noexec and atime options (rro and the other recursive forms
// as the plain ones: a copy has no submounts). Any other option on a bind
// mount fails the create, naming the mount. The helper then
// creates devices, copies the files, masks paths, sets the hostname (unless
// it joined the pod's uts namespace) and the spec's sysctls, moves the
// root disk onto / and chroots into it (pivot_root does not work from an
// initramfs), reports ready and waits. StartProcess sends it one byte: it
// applies rlimits, capabilities, uid/gids and no_new_privs, and execs the
// container's process, which stays PID 1 of the container.
//
// Exec cannot setns into a mount namespace from the multithreaded agent, so
// the agent enters only the init's pid namespace, on a locked thread that is
// thrown away afterwards, and starts the helper from there (again straight into
// the cgroup). The helper, on one locked thread, unshares its filesystem
// context, setns into the init's uts, ipc and mount namespaces, chroots into
// the init's root (an fd of /proc/<pid>/root opened by the agent) and execs
// from that same thread: namespaces, credentials and no_new_privs are per
// thread, and execve keeps the calling thread's.
//
// Errors of the helper come back on a status pipe that execve closes
// (O_CLOEXEC), so the agent knows whether the exec happened.
//
// # Processes
//
// One Reaper reaps every child of PID 1 (wait4(-1) on SIGCHLD) and hands exits
// to the process that registered the pid; registration happens under the same
// lock as reaping, so an exit cannot be lost, and nothing else waits. Output
// goes through pipes (or a pty: Setsid+Setctty, TIOCSWINSZ) into a bounded
// buffer per stream; ReadStdio long-polls it and a full buffer blocks the
// writing process.
//
// A container's init is PID 1 of its pid namespace, and the kernel drops a
// signal to it that it neither catches nor blocks, whoever sends it (only
// SIGKILL and SIGSTOP are forced). SignalProcess therefore holds a signal to
// an init that started less than 5 s ago and neither catches, ignores nor
// waits for it (sigwait, or a block that lasts 100 ms: signalfd), and sends
// it once it does, or at the 5 s mark, when the kernel's drop is the answer
// as with runc; it is dropped if the init exits first. A caught signal also
// waits until the init has first been seen asleep: a script's shell catches
// SIGINT from its start (and exits 130 on it) before its trap is set. Signals sent after a
// held one queue behind it; SIGKILL and SIGSTOP never wait.
//
// The mounts of /run are shared and each container's copy is a slave: when
// the agent unmounts one container's disk, the unmount reaches the other
// containers' mount namespaces and the device is not kept busy.
package guest
