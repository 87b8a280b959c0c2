package stack

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// TTYRows and TTYCols are the size of AtTerminal's terminal.
const TTYRows, TTYCols = 40, 100

// TTYSizeScript prints the size of its terminal (stty size) once it has
// one, waiting up to 5 s: the client's size reaches a process's pty after
// the process has started (containerd resizes after Start, under runc as
// here), so a program that reads it at once can find none (0 0). A
// shell's prompt is redrawn at the resize's SIGWINCH. It waits for a size
// printed, not for stty's status: busybox's stty size exits 0 when the
// terminal has none, printing only an error.
const TTYSizeScript = `i=0; until s=$(stty size 2>/dev/null) && [ -n "$s" ] && [ "$s" != "0 0" ] || [ $i -ge 50 ]; do i=$((i+1)); sleep 0.1; done; stty size`

// AtTerminal is cmd run with a pseudo-terminal of TTYRows by TTYCols as
// its stdin and stdout, through util-linux's script: a client that sends
// its terminal's size on (crictl exec -it, kubectl exec -it) sends that.
// The terminal's output is the command's; ctx ends it. The command is
// found by its name (Args[0]) in cmd.Env's PATH, as the shell finds it,
// not in this process's.
func AtTerminal(ctx context.Context, cmd *exec.Cmd) *exec.Cmd {
	q := []string{fmt.Sprintf("stty rows %d cols %d;", TTYRows, TTYCols)}
	for _, a := range cmd.Args {
		q = append(q, shellQuote(a))
	}
	tty := exec.CommandContext(ctx, "script", "-qec", strings.Join(q, " "), "/dev/null")
	tty.Env, tty.Dir = cmd.Env, cmd.Dir
	return tty
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
