package sandbox

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cryo-runtime/cryo/network"
)

func TestGuestNetworkRequests(t *testing.T) {
	mac, _ := net.ParseMAC("0a:58:0a:58:05:03")
	ep := &network.Endpoint{Name: "eth0", MAC: mac, MTU: 1450, Addresses: []string{"10.88.5.3/24"},
		Routes: []network.Route{{Gateway: "10.88.5.1", Device: "eth0"}, {Destination: "10.99.0.0/16", Gateway: "10.88.5.1", Device: "eth0", Metric: 5}}}
	iface, routes := guestNetworkRequests(ep)
	if iface.Mac != "0a:58:0a:58:05:03" || iface.Name != "eth0" || iface.Mtu != 1450 || len(iface.Addresses) != 1 || iface.Addresses[0] != "10.88.5.3/24" {
		t.Fatalf("interface request = %+v", iface)
	}
	if len(routes.Routes) != 2 || routes.Routes[0].Destination != "" || routes.Routes[0].Gateway != "10.88.5.1" ||
		routes.Routes[1].Destination != "10.99.0.0/16" || routes.Routes[1].Metric != 5 {
		t.Fatalf("routes request = %+v", routes.Routes)
	}
	pn := &podNetwork{ep: ep}
	if n := pn.nics(); len(n) != 1 || n[0].MAC != "0a:58:0a:58:05:03" || n[0].ID != guestNICID {
		t.Fatalf("nics = %+v", n)
	}
	var none *podNetwork
	if none.nics() != nil || none.configureGuest(context.Background(), nil) != nil {
		t.Fatal("a nil podNetwork must be a no-op")
	}
	none.teardown(context.Background())
}

// TestRestoredNetworkRefusesAnotherLayout: a restored VM's devices must be
// the snapshot's, so a NIC without a pod network, or a pod network without
// a NIC, is refused before anything is set up, as is a MAC that is not one.
func TestRestoredNetworkRefusesAnotherLayout(t *testing.T) {
	withNetNS := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-x"}}}}
	noNetNS := &specs.Spec{}
	for _, tc := range []struct {
		name string
		spec *specs.Spec
		mac  string
		want error
	}{
		{"nic, no pod network", noNetNS, "02:00:00:00:00:01", errdefs.ErrFailedPrecondition},
		{"pod network, no nic", withNetNS, "", errdefs.ErrFailedPrecondition},
		{"bad mac", withNetNS, "not-a-mac", errdefs.ErrDataLoss},
	} {
		pn, err := restoredNetwork(context.Background(), tc.spec, &sandboxRecord{NICMAC: tc.mac})
		if !errors.Is(err, tc.want) || pn != nil {
			t.Errorf("%s: %v, %v; want %v", tc.name, pn, err, tc.want)
		}
	}
	if pn, err := restoredNetwork(context.Background(), noNetNS, &sandboxRecord{}); pn != nil || err != nil {
		t.Errorf("no nic, no pod network: %v, %v; want none and no error", pn, err)
	}
}
