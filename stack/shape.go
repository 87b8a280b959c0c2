package stack

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Link is loopback traffic of one port shaped to a rate.
type Link struct{}

// Shape limits the loopback traffic to and from one TCP port (a store's)
// to rate (tc's syntax, e.g. "1gbit"), as if the store were across a link
// of that speed; everything else on lo passes unshaped. This kernel has
// the htb qdisc and the u32 filter (not netem or prio). Remove the link
// also when the measurement fails. Shape refuses a loopback that already
// has a root qdisc of its own: it would replace someone's shaping.
func Shape(port int, rate string) (*Link, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("shape: port %d", port)
	}
	if _, err := exec.LookPath("tc"); err != nil {
		return nil, errors.New("shape: tc not found: install Debian's iproute2")
	}
	out, err := exec.Command("tc", "qdisc", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("shape: tc qdisc show dev lo: %w: %s", err, out)
	}
	if root := string(out); !strings.HasPrefix(root, "qdisc noqueue") && !strings.HasPrefix(root, "qdisc pfifo") {
		return nil, fmt.Errorf("shape: lo already has a root qdisc (%s); remove it first: tc qdisc del dev lo root", strings.TrimSpace(root))
	}
	l := &Link{}
	p := strconv.Itoa(port)
	// htb's default class 1:10 is far above what lo moves here; the store's
	// traffic, either way, goes to 1:20 at rate.
	for _, args := range [][]string{
		{"qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10"},
		{"class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate", "400gbit", "quantum", "200000"},
		{"class", "add", "dev", "lo", "parent", "1:1", "classid", "1:10", "htb", "rate", "400gbit", "quantum", "200000"},
		{"class", "add", "dev", "lo", "parent", "1:1", "classid", "1:20", "htb", "rate", rate, "ceil", rate, "quantum", "200000"},
		{"filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip", "sport", p, "0xffff", "flowid", "1:20"},
		{"filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip", "dport", p, "0xffff", "flowid", "1:20"},
	} {
		if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
			return nil, errors.Join(fmt.Errorf("shape: tc %s: %w: %s", strings.Join(args, " "), err, out), l.Remove())
		}
	}
	return l, nil
}

// ShapeEndpoint is Shape for the port of a store's host:port endpoint.
func ShapeEndpoint(endpoint, rate string) (*Link, error) {
	_, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("shape: endpoint %q: %w", endpoint, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("shape: endpoint %q: port %q: %w", endpoint, port, err)
	}
	return Shape(p, rate)
}

// Remove removes the shaping.
func (l *Link) Remove() error {
	if out, err := exec.Command("tc", "qdisc", "del", "dev", "lo", "root").CombinedOutput(); err != nil {
		return fmt.Errorf("unshape lo: %w: %s", err, out)
	}
	return nil
}

var sentRE = regexp.MustCompile(`Sent ([0-9]+) bytes`)

// Bytes is what crossed the link so far, both ways, IP headers included:
// what a store served and took.
func (l *Link) Bytes() (int64, error) {
	out, err := exec.Command("tc", "-s", "class", "show", "dev", "lo", "classid", "1:20").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("tc -s class show dev lo: %w: %s", err, out)
	}
	m := sentRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("tc -s class show dev lo: no byte count in %q", out)
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
}
