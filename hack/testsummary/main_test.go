package main

import (
	"bytes"
	"strings"
	"testing"
)

// Event streams as go1.26 `go test -json` writes them, cut to the events
// that matter.
const (
	passing = `{"Action":"run","Package":"m/ok","Test":"TestA"}
{"Action":"pass","Package":"m/ok","Test":"TestA"}
{"Action":"run","Package":"m/ok","Test":"TestB"}
{"Action":"skip","Package":"m/ok","Test":"TestB"}
{"Action":"pass","Package":"m/ok"}
`
	failingSubtest = `{"Action":"run","Package":"m/f","Test":"TestSub"}
{"Action":"run","Package":"m/f","Test":"TestSub/good"}
{"Action":"pass","Package":"m/f","Test":"TestSub/good"}
{"Action":"run","Package":"m/f","Test":"TestSub/bad"}
{"Action":"fail","Package":"m/f","Test":"TestSub/bad"}
{"Action":"fail","Package":"m/f","Test":"TestSub"}
{"Action":"run","Package":"m/f","Test":"TestPlain"}
{"Action":"fail","Package":"m/f","Test":"TestPlain"}
{"Action":"fail","Package":"m/f"}
`
	timeout = `{"Action":"run","Package":"m/t","Test":"TestHangs"}
{"Action":"run","Package":"m/t","Test":"TestHangs/inner"}
{"Action":"output","Package":"m/t","Test":"TestHangs/inner","Output":"panic: test timed out after 75m0s\n"}
{"Action":"output","Package":"m/t","Output":"FAIL\tm/t\t4500.1s\n"}
{"Action":"fail","Package":"m/t"}
`
	buildFailures = `{"ImportPath":"m/lib","Action":"build-output","Output":"# m/lib\n"}
{"ImportPath":"m/lib","Action":"build-output","Output":"lib/x.go:3:1: syntax error\n"}
{"ImportPath":"m/lib","Action":"build-fail"}
{"Action":"output","Package":"m/a","Output":"FAIL\tm/a [build failed]\n"}
{"Action":"fail","Package":"m/a","FailedBuild":"m/lib"}
{"Action":"fail","Package":"m/b","FailedBuild":"m/lib"}
`
	messages = `{"Action":"run","Package":"m/m","Test":"TestMsg"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"=== RUN   TestMsg\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"    m_test.go:10: step one\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"    m_test.go:11: step two\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"    m_test.go:12: step three\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"    m_test.go:20: labels are 01x0: not one instant\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"        the rest of the message\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"    m_test.go:21: Checkpoint is Failed, want Succeeded:\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"        status: {}\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"    harness.go:60: dump of the kubelet log:\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"        I1207 kubelet.go:1: x.go:2: a line of the log\n"}
{"Action":"output","Package":"m/m","Test":"TestMsg","Output":"--- FAIL: TestMsg (1.00s)\n"}
{"Action":"fail","Package":"m/m","Test":"TestMsg"}
{"Action":"run","Package":"m/m","Test":"TestQuiet"}
{"Action":"output","Package":"m/m","Test":"TestQuiet","Output":"    m_test.go:30: all is well\n"}
{"Action":"pass","Package":"m/m","Test":"TestQuiet"}
{"Action":"fail","Package":"m/m"}
`
	teardown = `{"Action":"run","Package":"m/td","Test":"TestOK"}
{"Action":"pass","Package":"m/td","Test":"TestOK"}
{"Action":"output","Package":"m/td","Output":"PASS\n"}
{"Action":"output","Package":"m/td","Output":"leak: qemu pid 123 left behind\n"}
{"Action":"output","Package":"m/td","Output":"FAIL\tm/td\t0.002s\n"}
{"Action":"fail","Package":"m/td"}
`
)

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		name, events, want string
	}{
		{"passing", passing, "tests: 1 passed, 0 failed, 1 skipped\n"},
		{"a failed subtest names itself, not its parent", failingSubtest,
			"FAIL m/f TestSub/bad\nFAIL m/f TestPlain\ntests: 1 passed, 3 failed, 0 skipped\n"},
		{"a failed test shows its last messages, not a cleanup's dump", messages,
			"FAIL m/m TestMsg\n    m_test.go:12: step three\n    m_test.go:20: labels are 01x0: not one instant\n    m_test.go:21: Checkpoint is Failed, want Succeeded:\ntests: 1 passed, 1 failed, 0 skipped\n"},
		{"a timeout names the innermost running test and the panic", timeout,
			"FAIL m/t TestHangs/inner (did not finish: panic: test timed out after 75m0s)\ntests: 0 passed, 2 failed, 0 skipped\n"},
		{"a build failure shows the compiler once", buildFailures,
			"FAIL m/a [build failed]\n    lib/x.go:3:1: syntax error\nFAIL m/b [build failed: m/lib, above]\ntests: 0 passed, 0 failed, 0 skipped\n"},
		{"a package failing after its tests shows its last lines", teardown,
			"FAIL m/td (no test failed; the package's last lines:)\n    leak: qemu pid 123 left behind\ntests: 1 passed, 0 failed, 0 skipped\n"},
		{"lines that are not JSON are skipped", "go: downloading x\n" + passing, "tests: 1 passed, 0 failed, 1 skipped\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSummary()
			if err := s.read(strings.NewReader(tc.events)); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			s.write(&out)
			if out.String() != tc.want {
				t.Errorf("summary:\n%s\nwant:\n%s", out.String(), tc.want)
			}
		})
	}
}

// Two files (the unit and the integration phase) add up.
func TestSummaryOfTwoPhases(t *testing.T) {
	s := newSummary()
	for _, events := range []string{passing, failingSubtest} {
		if err := s.read(strings.NewReader(events)); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	s.write(&out)
	if want := "tests: 2 passed, 3 failed, 1 skipped\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("summary:\n%s\nwant it to end with %q", out.String(), want)
	}
}
