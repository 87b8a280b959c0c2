package network

import (
	"net"
	"reflect"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func link(name string, index int, flags net.Flags) netlink.Link {
	return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, Index: index, Flags: flags}}
}

func TestPickLink(t *testing.T) {
	for _, tc := range []struct {
		name  string
		links []netlink.Link
		want  string
	}{
		{"veth beside lo", []netlink.Link{link("lo", 1, net.FlagLoopback), link("eth0", 3, 0)}, "eth0"},
		{"other name", []netlink.Link{link("lo", 1, net.FlagLoopback), link("net1", 5, 0)}, "net1"},
		{"tap ignored", []netlink.Link{link("tap0_cryo", 2, 0), link("lo", 1, net.FlagLoopback), link("net1", 5, 0)}, "net1"},
		{"eth0 preferred", []netlink.Link{link("net1", 2, 0), link("eth0", 7, 0)}, "eth0"},
		{"lowest index", []netlink.Link{link("net2", 9, 0), link("net1", 4, 0)}, "net1"},
		{"only lo", []netlink.Link{link("lo", 1, net.FlagLoopback), link("tap0_cryo", 2, 0)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := pickLink(tc.links, "tap0_cryo")
			if tc.want == "" {
				if !errdefs.IsNotFound(err) {
					t.Fatalf("err = %v, want not found", err)
				}
				return
			}
			if err != nil || l.Attrs().Name != tc.want {
				t.Fatalf("picked %v (%v), want %s", l, err, tc.want)
			}
		})
	}
}

func cidr(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

func TestAddresses(t *testing.T) {
	got := addresses([]netlink.Addr{
		{IPNet: cidr("10.88.5.3/24"), Scope: unix.RT_SCOPE_UNIVERSE},
		{IPNet: cidr("fe80::1/64"), Scope: unix.RT_SCOPE_LINK},
		{IPNet: cidr("fd00::3/64"), Scope: unix.RT_SCOPE_UNIVERSE},
		{IPNet: cidr("169.254.1.1/16"), Scope: unix.RT_SCOPE_LINK},
	})
	if want := []string{"10.88.5.3/24", "fd00::3/64"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("addresses = %v, want %v", got, want)
	}
}

func TestRoutes(t *testing.T) {
	_, def, _ := net.ParseCIDR("0.0.0.0/0")
	_, sub, _ := net.ParseCIDR("10.88.5.0/24")
	_, other, _ := net.ParseCIDR("10.99.0.0/16")
	_, ll, _ := net.ParseCIDR("fe80::/64")
	got := routes([]netlink.Route{
		{Dst: sub, Protocol: unix.RTPROT_KERNEL, Src: net.ParseIP("10.88.5.3"), Table: unix.RT_TABLE_MAIN},
		{Dst: def, Gw: net.ParseIP("10.88.5.1"), Protocol: unix.RTPROT_BOOT, Table: unix.RT_TABLE_MAIN},
		{Gw: net.ParseIP("10.88.5.1"), Priority: 100, Table: unix.RT_TABLE_MAIN},
		{Dst: other, Src: net.ParseIP("10.88.5.3"), Protocol: unix.RTPROT_STATIC, Table: unix.RT_TABLE_MAIN},
		{Dst: ll, Protocol: unix.RTPROT_BOOT, Table: unix.RT_TABLE_MAIN},
		{Dst: other, Gw: net.ParseIP("10.88.5.9"), Table: 100},
	}, "eth0")
	want := []Route{
		{Gateway: "10.88.5.1", Device: "eth0"},
		{Gateway: "10.88.5.1", Device: "eth0", Metric: 100},
		{Destination: "10.99.0.0/16", Device: "eth0", Source: "10.88.5.3"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("routes = %+v\nwant %+v", got, want)
	}
}

func TestRedirectFilter(t *testing.T) {
	f := redirectFilter(3, 7)
	if f.LinkIndex != 3 || f.Parent != netlink.MakeHandle(0xffff, 0) || f.Protocol != unix.ETH_P_ALL || f.Sel != nil {
		t.Fatalf("filter attrs = %+v (sel %v): want a match-all on the ingress qdisc of link 3", f.FilterAttrs, f.Sel)
	}
	if len(f.Actions) != 1 {
		t.Fatalf("actions = %v", f.Actions)
	}
	m, ok := f.Actions[0].(*netlink.MirredAction)
	if !ok || m.Ifindex != 7 || m.MirredAction != netlink.TCA_EGRESS_REDIR || m.Attrs().Action != netlink.TC_ACT_STOLEN {
		t.Fatalf("action = %+v, want a stolen egress redirect to link 7", f.Actions[0])
	}
}
