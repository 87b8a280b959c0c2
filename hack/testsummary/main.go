// Command testsummary reads the test events that `go test -json` (through
// gotestsum's --jsonfile) wrote and prints what failed, one line each:
//
//	FAIL <package> <Test>                   followed by its last messages
//	FAIL <package> <Test> (did not finish: panic: test timed out after 75m0s)
//	FAIL <package> [build failed]           followed by the compiler's lines
//	FAIL <package> (no test failed)         followed by the package's last lines
//
// and a closing count, "tests: N passed, N failed, N skipped". hack/test.sh
// prints it last, because CI shows only a run's tail and the failing test's
// name is often thousands of lines above it. A failed test's last messages
// (the first line of each t.Log, t.Error or t.Fatal, which the output does
// not tell apart) say why it failed without the log: the failure is the last
// but for the dumps a cleanup adds, which begin with "dump of " (dumpPrefix).
//
// usage: testsummary FILE.json...
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json), with the build
// events of Go 1.24 (ImportPath, build-output, FailedBuild).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string
	FailedBuild string
}

// Lines of a package's own output shown under a failure that names no test,
// and of compiler output under a build failure: enough for the first error,
// the rest is in the log.
const (
	packageTailLines = 8
	buildErrorLines  = 10
)

// A failed test's messages shown under its FAIL line, and a message's
// length there: the tail of a long run must stay short.
const (
	testMessages     = 3
	messageLineBytes = 240
)

// messageRe is the first line of a test's message: go test indents it by
// four blanks per level of subtest and starts it with the file and line.
var messageRe = regexp.MustCompile(`^ +[^ ]+\.go:[0-9]+: `)

// dumpPrefix begins a message that a failed test's cleanup logs (a
// process's log, a guest's console): the tests' own convention. It is
// not the failure, which comes before it.
const dumpPrefix = "dump of "

type pkgResult struct {
	name        string
	failed      bool
	failedBuild string
	tests       map[string]string   // test name → last action (run, pass, fail, skip)
	messages    map[string][]string // test name → its last messages' first lines
	order       []string            // test names in the order they started
	output      []string            // the package's own output, not a test's
	panic       string              // the first panic line, in any test's output
}

type summary struct {
	pkgs        map[string]*pkgResult
	order       []string            // packages in the order they first appeared
	buildOutput map[string][]string // ImportPath → compiler output
}

func newSummary() *summary {
	return &summary{pkgs: map[string]*pkgResult{}, buildOutput: map[string][]string{}}
}

func main() {
	s := newSummary()
	for _, name := range os.Args[1:] {
		if err := s.readFile(name); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
	}
	s.write(os.Stdout)
}

func (s *summary) readFile(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return s.read(f)
}

// read takes events line by line; a line that is not JSON (a go command
// message that test2json did not wrap) is skipped, as gotestsum does.
func (s *summary) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var ev event
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		s.add(ev)
	}
	return sc.Err()
}

func (s *summary) add(ev event) {
	if ev.Action == "build-output" {
		s.buildOutput[ev.ImportPath] = append(s.buildOutput[ev.ImportPath], ev.Output)
		return
	}
	if ev.Package == "" {
		return
	}
	p := s.pkg(ev.Package)
	if ev.Action == "output" && p.panic == "" && strings.HasPrefix(ev.Output, "panic: ") {
		p.panic = strings.TrimSpace(ev.Output)
	}
	switch {
	case ev.Test == "" && ev.Action == "output":
		p.output = append(p.output, ev.Output)
	case ev.Action == "output":
		p.addMessage(ev.Test, ev.Output)
	case ev.Test == "" && ev.Action == "fail":
		p.failed, p.failedBuild = true, ev.FailedBuild
	case ev.Test != "" && (ev.Action == "run" || ev.Action == "pass" || ev.Action == "fail" || ev.Action == "skip"):
		if _, seen := p.tests[ev.Test]; !seen {
			p.order = append(p.order, ev.Test)
		}
		p.tests[ev.Test] = ev.Action
	}
}

func (s *summary) pkg(name string) *pkgResult {
	p, ok := s.pkgs[name]
	if !ok {
		p = &pkgResult{name: name, tests: map[string]string{}, messages: map[string][]string{}}
		s.pkgs[name] = p
		s.order = append(s.order, name)
	}
	return p
}

func (s *summary) write(w io.Writer) {
	var passed, failed, skipped int
	printedBuild := map[string]bool{}
	for _, name := range s.order {
		p := s.pkgs[name]
		for _, action := range p.tests {
			switch action {
			case "pass":
				passed++
			case "skip":
				skipped++
			default: // fail, or started and never ended
				failed++
			}
		}
		if !p.failed {
			continue
		}
		switch {
		case p.failedBuild != "":
			s.writeBuildFailure(w, p, printedBuild)
		case !p.writeFailedTests(w):
			fmt.Fprintf(w, "FAIL %s (no test failed; the package's last lines:)\n", p.name)
			writeIndented(w, tail(p.ownLines(), packageTailLines))
		}
	}
	fmt.Fprintf(w, "tests: %d passed, %d failed, %d skipped\n", passed, failed, skipped)
}

// writeBuildFailure prints the compiler's lines once per failed build: when a
// package that many import does not compile, every test package names it.
func (s *summary) writeBuildFailure(w io.Writer, p *pkgResult, printed map[string]bool) {
	if printed[p.failedBuild] {
		fmt.Fprintf(w, "FAIL %s [build failed: %s, above]\n", p.name, p.failedBuild)
		return
	}
	printed[p.failedBuild] = true
	fmt.Fprintf(w, "FAIL %s [build failed]\n", p.name)
	var lines []string
	for _, l := range s.buildOutput[p.failedBuild] {
		if !strings.HasPrefix(l, "# ") {
			lines = append(lines, strings.TrimRight(l, "\n"))
		}
	}
	if len(lines) > buildErrorLines {
		lines = append(lines[:buildErrorLines], "...")
	}
	writeIndented(w, lines)
}

// writeFailedTests prints the tests that failed or never finished (the test
// binary panicked or timed out under them), leaves only: a parent fails with
// its subtest, and the subtest's line already names it. It reports whether
// it printed any.
func (p *pkgResult) writeFailedTests(w io.Writer) bool {
	var bad []string
	for _, t := range p.order {
		if a := p.tests[t]; a == "fail" || a == "run" {
			bad = append(bad, t)
		}
	}
	printed := false
	for _, t := range bad {
		if hasDescendant(bad, t) {
			continue
		}
		printed = true
		if p.tests[t] == "run" {
			fmt.Fprintf(w, "FAIL %s %s (did not finish: %s)\n", p.name, t, p.cause())
			writeIndented(w, p.messages[t])
			continue
		}
		fmt.Fprintf(w, "FAIL %s %s\n", p.name, t)
		writeIndented(w, p.messages[t])
	}
	return printed
}

// addMessage keeps the first line of a test's message, the last
// testMessages of them: a cleanup's dump is not one.
func (p *pkgResult) addMessage(test, line string) {
	line = strings.TrimRight(line, "\n")
	loc := messageRe.FindStringIndex(line)
	if loc == nil || strings.HasPrefix(line[loc[1]:], dumpPrefix) {
		return
	}
	line = strings.TrimLeft(line, " ")
	if len(line) > messageLineBytes {
		line = strings.ToValidUTF8(line[:messageLineBytes], "") + "..."
	}
	m := append(p.messages[test], line)
	p.messages[test] = m[max(0, len(m)-testMessages):]
}

// cause is the panic that ended the test binary (a timeout is one), if its
// output has one.
func (p *pkgResult) cause() string {
	if p.panic != "" {
		return p.panic
	}
	return "the test binary ended under it; see the log"
}

// ownLines is the package's output without go test's PASS/FAIL/ok lines.
func (p *pkgResult) ownLines() []string {
	var lines []string
	for _, l := range p.output {
		l = strings.TrimRight(l, "\n")
		if l == "" || l == "PASS" || l == "FAIL" || strings.HasPrefix(l, "FAIL\t") || strings.HasPrefix(l, "ok  \t") {
			continue
		}
		lines = append(lines, l)
	}
	return lines
}

func hasDescendant(names []string, parent string) bool {
	for _, n := range names {
		if strings.HasPrefix(n, parent+"/") {
			return true
		}
	}
	return false
}

func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

func writeIndented(w io.Writer, lines []string) {
	for _, l := range lines {
		fmt.Fprintf(w, "    %s\n", l)
	}
}
