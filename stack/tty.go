package stack

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// TTYRows and TTYCols are the size of AtTerminal's terminal.
const TTYRows, TTYCols = 40, 100

// AtTerminal is cmd run with a pseudo-terminal of TTYRows by TTYCols as
// its stdin and stdout, through util-linux's script: a client that sends
// its terminal's size on (crictl exec -it, kubectl exec -it) sends that.
// The terminal's output is the command's; ctx ends it.
func AtTerminal(ctx context.Context, cmd *exec.Cmd) *exec.Cmd {
	q := []string{fmt.Sprintf("stty rows %d cols %d;", TTYRows, TTYCols), shellQuote(cmd.Path)}
	for _, a := range cmd.Args[1:] {
		q = append(q, shellQuote(a))
	}
	tty := exec.CommandContext(ctx, "script", "-qec", strings.Join(q, " "), "/dev/null")
	tty.Env, tty.Dir = cmd.Env, cmd.Dir
	return tty
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
