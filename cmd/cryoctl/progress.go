package main

import (
	"io"
	"sync"

	"github.com/schollz/progressbar/v3"
)

// progress is a transfer progress bar on stderr, shown only when stdout is a
// terminal and the output is text; otherwise it does nothing.
type progress struct {
	mu  sync.Mutex
	bar *progressbar.ProgressBar
}

func (a *App) newProgress(total int64, what string) *progress {
	if !a.isTerminal() {
		return &progress{}
	}
	return &progress{bar: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(a.Stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100_000_000),
		progressbar.OptionClearOnFinish(),
	)}
}

// Add counts n transferred bytes; safe for concurrent use.
func (p *progress) Add(n int64) {
	if p == nil || p.bar == nil {
		return
	}
	p.mu.Lock()
	p.bar.Add64(n)
	p.mu.Unlock()
}

// Reader counts what r reads.
func (p *progress) Reader(r io.Reader) io.Reader {
	if p.bar == nil {
		return r
	}
	return &countReader{r: r, p: p}
}

// Writer counts what w writes.
func (p *progress) Writer(w io.Writer) io.Writer {
	if p.bar == nil {
		return w
	}
	return io.MultiWriter(w, writerFunc(func(b []byte) (int, error) { p.Add(int64(len(b))); return len(b), nil }))
}

func (p *progress) Done() {
	if p.bar != nil {
		p.mu.Lock()
		p.bar.Finish()
		p.mu.Unlock()
	}
}

type countReader struct {
	r io.Reader
	p *progress
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.Add(int64(n))
	return n, err
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
