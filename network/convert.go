package network

import (
	"fmt"
	"net"
	"sort"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// pickLink returns the pod's CNI interface: the only one that is neither
// loopback nor our tap ("eth0" wins when CNI made several).
func pickLink(links []netlink.Link, tapName string) (netlink.Link, error) {
	var found []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || a.Name == "lo" || a.Name == tapName {
			continue
		}
		if a.Name == "eth0" {
			return l, nil
		}
		found = append(found, l)
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("no network interface besides loopback: %w", errdefs.ErrNotFound)
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Attrs().Index < found[j].Attrs().Index })
	return found[0], nil
}

// addresses returns the global (not link-local) addresses in CIDR form.
func addresses(as []netlink.Addr) []string {
	var out []string
	for _, a := range as {
		if a.IPNet == nil || a.IP.IsLinkLocalUnicast() || a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		out = append(out, a.IPNet.String())
	}
	return out
}

// routes returns the routes the guest must be given: not the ones the kernel
// makes from an address (the guest's kernel makes them too) and not
// link-local ones.
func routes(rs []netlink.Route, dev string) []Route {
	var out []Route
	for _, r := range rs {
		if r.Protocol == unix.RTPROT_KERNEL || (r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast()) {
			continue
		}
		if r.Table != 0 && r.Table != unix.RT_TABLE_MAIN {
			continue
		}
		gr := Route{Device: dev, Metric: r.Priority}
		if r.Dst != nil && !isDefault(r.Dst) {
			gr.Destination = r.Dst.String()
		}
		if r.Gw != nil {
			gr.Gateway = r.Gw.String()
		}
		if r.Src != nil {
			gr.Source = r.Src.String()
		}
		out = append(out, gr)
	}
	return out
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0 && n.IP.IsUnspecified()
}
