package watchdog

import (
	"bytes"
	"context"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestArm(t *testing.T) {
	dump := make(chan os.Signal, 4)
	signal.Notify(dump, syscall.SIGUSR1)
	defer signal.Stop(dump)
	var out syncBuffer
	l := logrus.New()
	l.SetOutput(&out)
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(l))

	// stopped in time: nothing
	Arm(ctx, "/fast", 100*time.Millisecond)()
	time.Sleep(200 * time.Millisecond)
	if s := out.String(); s != "" {
		t.Fatalf("a call that ended in time was reported: %s", s)
	}
	select {
	case <-dump:
		t.Fatal("a call that ended in time asked for a goroutine dump")
	default:
	}

	// outran the bound: reported, with a dump
	stop := Arm(ctx, "/slow", 50*time.Millisecond)
	defer stop()
	select {
	case <-dump:
	case <-time.After(5 * time.Second):
		t.Fatal("no SIGUSR1 for a stuck call")
	}
	if s := out.String(); !strings.Contains(s, StuckMessage) || !strings.Contains(s, "/slow") {
		t.Fatalf("log = %q, want %q naming the call", s, StuckMessage)
	}
}

func TestFromEnv(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 0, "60s": time.Minute, "junk": 0, "-1s": 0} {
		t.Setenv(Env, v)
		if got := FromEnv(); got != want {
			t.Errorf("%s=%q: %s, want %s", Env, v, got, want)
		}
	}
}
