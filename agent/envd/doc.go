// Package envd is the sandbox-side API of E2B's SDK, served by cryo-agent
// inside the guest on port 49983 for a pod that asks for it (the pod
// annotation cryo.dev/envd-access-token-sha256): GET /health, POST /init,
// GET and POST /files, and the Connect services process.Process and
// filesystem.Filesystem (spec/). Processes and files are those of one
// container of the pod, reached through the Container it is given.
//
// # Turning it on
//
// The annotation carries the lowercase hex SHA-256 of the sandbox's access
// token. containerd copies it from the pod onto its containers' specs
// (pod_annotations = ["cryo.dev/*"]), the shim checks its form and hands
// the specs to the guest unchanged, and the agent starts envd when it
// creates a container whose spec has it and whose CRI container type is
// "container" (the pause container carries the pod's annotations too).
// One envd serves a guest: the first such container is its container,
// until it stops and another such container is created (the kubelet
// restarting it), which envd then serves. A pod without the annotation has
// no envd and no listener.
//
// # Access
//
// The guest's network namespace is the pod's, so the listener is on the
// pod's address; other tenants' pods can reach it, hence every route but
// /health wants the access token (X-Access-Token; 401 otherwise). The
// token's hash comes with the container's spec (a path the tenant's own
// pod defines, never the network); the plain token arrives later on
// /init, checked against it, and is needed only to verify the SDK's signed
// file URLs. /init also sets the env vars, user and workdir that new
// processes default to.
//
// # Processes
//
// Start runs a process inside the container like the agent's exec does:
// the container's namespaces, root and cgroup, its process's
// capabilities, rlimits and no_new_privs, and the credentials (uid, gid,
// groups from the container's /etc/passwd and /etc/group) of the user the
// request names in its Basic auth header, else /init's default user, else
// the container's own process user; an unknown user is Unauthenticated.
// Its environment is the container's process environment, then HOME, USER
// and LOGNAME of the user and E2B_SANDBOX=true, /init's env vars (the
// control plane's E2B_SANDBOX_ID and E2B_TEMPLATE_ID among them) and the
// request's, each replacing the ones before. Its cwd is the request's ("~" and relative
// paths start at the user's home), else /init's default workdir, else the
// user's home; a missing one is InvalidArgument, as is a command that
// cannot be executed. Stdin is a pipe unless the request says stdin=false
// (E2B's SDK does for commands.run unless asked); a PTY request puts the
// process on a terminal of the asked size, leading its session. Pids are
// those of the container's pid namespace, as its own ps shows them.
//
// A Start stream sends the start event (the pid), the output as it comes
// (stdout and stderr, or pty), a keepalive event after every idle
// interval the client's Keepalive-Ping-Interval header asks for (seconds;
// 90 s without one), and the end: exit_code, exited, status and error as
// Go's os.ProcessState reports them ("exit status 1"; -1 and
// "signal: killed" for a killed process), which is what E2B's envd sends.
// The request's timeout (Connect-Timeout-Ms: the SDK's timeoutMs, 60 s
// unless set, 0 for none) kills the process when it passes, as E2B's
// envd does. A client that goes away leaves the process running.
//
// Output fans out to every subscriber (the Start stream and any Connect
// streams, by pid or tag). While one is connected, a process whose slowest
// subscriber is 1 MiB behind blocks in its write, as a process writing to
// a slow terminal does; every write of a stream has a 30 s deadline, so a
// client that stopped reading (one that was connected to the pod a
// snapshot came from, say) is dropped instead of stalling the process.
// While nobody is connected the process never blocks: the newest 1 MiB of
// its output is kept, and the next subscriber gets it first. A subscriber
// that joins while another is connected gets the output from then on.
// Every subscriber gets the end. Output that a child left behind still
// writes to the process's pipes after it exited is cut 1 s after the
// exit.
//
// List shows the processes started through envd that have not ended, with
// their config and tag. SendInput and StreamInput write to a process's
// stdin or terminal (the other is FailedPrecondition), CloseStdin ends a
// pipe (a terminal has none: send Ctrl-D), SendSignal sends SIGTERM or
// SIGKILL, Update resizes a terminal. An unknown or ended pid or tag is
// NotFound, which the SDK's kill turns into false; but Connect, as E2B's
// envd, answers for an ended process for 30 s with its start and end
// events (the newest 1024 ends are kept), so commands.connect(pid) just
// after the exit gets its exit code.
//
// # Pause and resume
//
// envd and its processes are part of the guest's memory: a checkpoint
// takes them as they are and a restore brings them back, with the token
// and /init's defaults, into the new pod (no container is created there,
// so nothing is started again). commands.connect(pid) in the restored
// sandbox attaches to the same process, whose output meanwhile waits in
// its backlog. Streams that were open at the checkpoint end in the
// restored guest by their write deadline.
package envd
