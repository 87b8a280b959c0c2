package stack

import (
	"slices"
	"testing"
)

// Every ctr command that makes a task's I/O FIFOs gets the Stack's FIFO
// dir, right after the subcommand (ctr takes flags only before the
// positional arguments); the others, and a caller's own choice, are left
// as they are.
func TestCtrArgs(t *testing.T) {
	const dir = "/tmp/cryo-it-1/fifo"
	for _, tc := range []struct {
		args, want []string
	}{
		{[]string{"run", "-d", "img", "c1", "sh"}, []string{"run", "--fifo-dir", dir, "-d", "img", "c1", "sh"}},
		{[]string{"task", "exec", "--exec-id", "x", "c1", "true"}, []string{"task", "exec", "--fifo-dir", dir, "--exec-id", "x", "c1", "true"}},
		{[]string{"t", "exec", "--detach", "--exec-id", "w", "c1", "sh"}, []string{"t", "exec", "--fifo-dir", dir, "--detach", "--exec-id", "w", "c1", "sh"}},
		{[]string{"tasks", "start", "c1"}, []string{"tasks", "start", "--fifo-dir", dir, "c1"}},
		{[]string{"task", "rm", "-f", "c1"}, []string{"task", "rm", "-f", "c1"}},
		{[]string{"task", "ls", "-q"}, []string{"task", "ls", "-q"}},
		{[]string{"image", "import", "a.tar"}, []string{"image", "import", "a.tar"}},
		{[]string{"task"}, []string{"task"}},
		{nil, nil},
		{[]string{"run", "--fifo-dir", "/x", "img", "c1"}, []string{"run", "--fifo-dir", "/x", "img", "c1"}},
		{[]string{"task", "exec", "--log-uri=file:///l", "--exec-id", "x", "c1", "true"}, []string{"task", "exec", "--log-uri=file:///l", "--exec-id", "x", "c1", "true"}},
	} {
		in := slices.Clone(tc.args)
		if got := ctrArgs(dir, tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("ctrArgs(%q) = %q, want %q", tc.args, got, tc.want)
		}
		if !slices.Equal(in, tc.args) {
			t.Errorf("ctrArgs changed its argument %q to %q", in, tc.args)
		}
	}
}
