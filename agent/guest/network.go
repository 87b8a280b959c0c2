package guest

import (
	"context"
	"fmt"
	"net"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/emptypb"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
	"github.com/cryo-runtime/cryo/internal/netdump"
)

// The VM's network namespace is the pod's: containers share it, so the
// interface configuration happens once, here.

func (s *Service) UpdateInterface(ctx context.Context, req *agentapi.UpdateInterfaceRequest) (*emptypb.Empty, error) {
	mac, err := net.ParseMAC(req.Mac)
	if err != nil {
		return nil, fmt.Errorf("interface mac %q: %w", req.Mac, errdefs.ErrInvalidArgument)
	}
	want, err := parseAddrs(req.Addresses)
	if err != nil {
		return nil, err
	}
	link, err := nicFor(mac)
	if err != nil {
		return nil, err
	}
	name := link.Attrs().Name
	if req.Name != "" && req.Name != name {
		if err := netlink.LinkSetDown(link); err != nil {
			return nil, fmt.Errorf("set %s down: %w", name, err)
		}
		if err := netlink.LinkSetName(link, req.Name); err != nil {
			return nil, fmt.Errorf("rename %s to %s: %w", name, req.Name, err)
		}
		name = req.Name
	}
	if req.Mtu != 0 {
		if err := netlink.LinkSetMTU(link, int(req.Mtu)); err != nil {
			return nil, fmt.Errorf("set mtu of %s: %w", name, err)
		}
	}
	if err := setAddrs(link, want); err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return &emptypb.Empty{}, nil
}

// nicFor returns the NIC that must have mac: the one that has it, else the
// guest's only Ethernet NIC, which then takes it. A restored guest's NIC
// still has the MAC it had at checkpoint time, which its source and every
// other clone of it have too: on one bridge they would steal each other's
// frames, so each takes its own pod's.
func nicFor(mac net.HardwareAddr) (netlink.Link, error) {
	link, err := linkByMAC(mac)
	if !errdefs.IsNotFound(err) {
		return link, err
	}
	link, err = soleNIC()
	if err != nil {
		return nil, fmt.Errorf("no interface with mac %s: %w", mac, err)
	}
	if err := setMAC(link, mac); err != nil {
		return nil, err
	}
	return netlink.LinkByIndex(link.Attrs().Index)
}

// soleNIC returns the guest's only Ethernet interface besides loopback.
func soleNIC() (netlink.Link, error) {
	links, err := netdump.Retry(netlink.LinkList)
	if err != nil {
		return nil, err
	}
	var nics []netlink.Link
	for _, l := range links {
		if a := l.Attrs(); a.EncapType == "ether" && len(a.HardwareAddr) == 6 {
			nics = append(nics, l)
		}
	}
	if len(nics) != 1 {
		return nil, fmt.Errorf("%d ethernet interfaces, want one to take the address: %w", len(nics), errdefs.ErrNotFound)
	}
	return nics[0], nil
}

// setMAC changes link's hardware address, live when the driver can
// (virtio-net with the control queue), else with the link down.
func setMAC(link netlink.Link, mac net.HardwareAddr) error {
	name := link.Attrs().Name
	if err := netlink.LinkSetHardwareAddr(link, mac); err == nil {
		return nil
	}
	if err := netlink.LinkSetDown(link); err != nil {
		return fmt.Errorf("set %s down: %w", name, err)
	}
	if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
		return fmt.Errorf("give %s the mac %s: %w", name, mac, err)
	}
	return nil
}

func linkByMAC(mac net.HardwareAddr) (netlink.Link, error) {
	links, err := netdump.Retry(netlink.LinkList)
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		if l.Attrs().HardwareAddr.String() == mac.String() {
			return l, nil
		}
	}
	return nil, fmt.Errorf("no interface with mac %s: %w", mac, errdefs.ErrNotFound)
}

func parseAddrs(cidrs []string) ([]*netlink.Addr, error) {
	var out []*netlink.Addr
	for _, c := range cidrs {
		a, err := netlink.ParseAddr(c)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", c, errdefs.ErrInvalidArgument)
		}
		out = append(out, a)
	}
	return out, nil
}

// setAddrs makes want the link's addresses, keeping IPv6 link-local ones.
func setAddrs(link netlink.Link, want []*netlink.Addr) error {
	have, err := netdump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, a := range want {
		keep[a.IPNet.String()] = true
	}
	for _, a := range have {
		if keep[a.IPNet.String()] || a.IP.IsLinkLocalUnicast() {
			continue
		}
		if err := netlink.AddrDel(link, &a); err != nil {
			return fmt.Errorf("delete %s: %w", a.IPNet, err)
		}
	}
	for _, a := range want {
		if err := netlink.AddrReplace(link, a); err != nil {
			return fmt.Errorf("add %s: %w", a.IPNet, err)
		}
	}
	return nil
}

func (s *Service) UpdateRoutes(ctx context.Context, req *agentapi.UpdateRoutesRequest) (*emptypb.Empty, error) {
	want := make([]*netlink.Route, 0, len(req.Routes))
	for _, r := range req.Routes {
		nr, err := toRoute(r)
		if err != nil {
			return nil, err
		}
		want = append(want, nr)
	}
	have, err := netdump.Retry(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range have {
		if r.Protocol == unix.RTPROT_KERNEL || (r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast()) {
			continue
		}
		if err := netlink.RouteDel(&r); err != nil {
			return nil, fmt.Errorf("delete route %s: %w", r, err)
		}
	}
	// link routes first: gateways must be reachable when their routes go in
	for _, pass := range []bool{false, true} {
		for _, r := range want {
			if (r.Gw != nil) != pass {
				continue
			}
			if err := netlink.RouteReplace(r); err != nil {
				return nil, fmt.Errorf("add route %s: %w", r, err)
			}
		}
	}
	return &emptypb.Empty{}, nil
}

func toRoute(r *agentapi.Route) (*netlink.Route, error) {
	nr := &netlink.Route{Priority: int(r.Metric), Table: unix.RT_TABLE_MAIN}
	bad := func(what string) error {
		return fmt.Errorf("route %v: %s: %w", r, what, errdefs.ErrInvalidArgument)
	}
	if r.Gateway != "" {
		if nr.Gw = net.ParseIP(r.Gateway); nr.Gw == nil {
			return nil, bad("gateway")
		}
	}
	if d := r.Destination; d != "" && d != "default" {
		_, dst, err := net.ParseCIDR(d)
		if err != nil {
			return nil, bad("destination")
		}
		nr.Dst = dst
	}
	if r.Source != "" {
		if nr.Src = net.ParseIP(r.Source); nr.Src == nil {
			return nil, bad("source")
		}
	}
	if r.Device != "" {
		l, err := netlink.LinkByName(r.Device)
		if err != nil {
			return nil, fmt.Errorf("route device %s: %w", r.Device, errdefs.ErrNotFound)
		}
		nr.LinkIndex = l.Attrs().Index
	}
	switch {
	case nr.Gw == nil && nr.LinkIndex == 0:
		return nil, bad("a link route needs a device")
	case nr.Gw == nil:
		nr.Scope = netlink.SCOPE_LINK
	}
	return nr, nil
}
