package storetest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, a ...any) {
	f.msg = fmt.Sprintf(format, a...)
	runtime.Goexit()
}

// A missing server binary fails the test and says how to get it.
func TestLookToolMissingFails(t *testing.T) {
	t.Setenv("CRYO_TOOLS", t.TempDir())
	t.Setenv("PATH", t.TempDir())
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); LookTool(f, "versitygw") }()
	<-done
	if !strings.Contains(f.msg, "run `make tools`") || !strings.Contains(f.msg, "versitygw") {
		t.Fatalf("message %q does not say to run `make tools`", f.msg)
	}
}
