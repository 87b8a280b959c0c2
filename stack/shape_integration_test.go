//go:build integration

package stack

import (
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestShapeLimitsOnePort: a shaped port moves about its rate; another port
// on lo is not slowed; the shaping is gone afterwards.
func TestShapeLimitsOnePort(t *testing.T) {
	shaped, other := listen(t), listen(t)
	link, err := Shape(shaped.Addr().(*net.TCPAddr).Port, "200mbit")
	if err != nil {
		t.Fatal(err)
	}
	defer link.Remove()
	const n25 = 25 << 20 // 25 MiB: 1 s at 200 Mbit/s
	slow := transfer(t, shaped, n25)
	fast := transfer(t, other, n25)
	t.Logf("25 MiB: shaped port %s, other port %s", slow, fast)
	if slow < 700*time.Millisecond || slow > 3*time.Second {
		t.Fatalf("shaped transfer took %s, want about 1 s at 200 Mbit/s", slow)
	}
	if fast > slow/4 {
		t.Fatalf("unshaped transfer took %s, shaped %s: the other port is slowed too", fast, slow)
	}
	if _, err := Shape(other.Addr().(*net.TCPAddr).Port, "1gbit"); err == nil || !strings.Contains(err.Error(), "already has a root qdisc") {
		t.Fatalf("second shaping: %v, want a refusal", err)
	}
	if n, err := link.Bytes(); err != nil || n < n25 || n > n25*11/10 {
		t.Fatalf("link carried %d bytes, %v; want about %d (the shaped transfer, not the other)", n, err, n25)
	}
	if err := link.Remove(); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("tc", "qdisc", "show", "dev", "lo").Output()
	if strings.Contains(string(out), "htb") {
		t.Fatalf("lo still shaped: %s", out)
	}
}

func listen(t *testing.T) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	return l
}

// transfer sends n bytes to l and returns how long until they were all
// taken.
func transfer(t *testing.T, l net.Listener, n int) time.Duration {
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	t0 := time.Now()
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	_, _ = io.Copy(io.Discard, c) // the server closes after reading all
	return time.Since(t0)
}
