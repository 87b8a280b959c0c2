//go:build integration

package network

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// vnetHdrLen is the virtio-net header in front of every frame on a tap
// opened with IFF_VNET_HDR (TUNSETVNETHDRSZ default).
const vnetHdrLen = 10

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// netnsPair makes two network namespaces of the test's own, "pod" and
// "peer", joined by a veth (eth0 in pod, vp0 in peer), with the pod's
// addresses and routes as CNI's bridge plugin would set them.
func netnsPair(t *testing.T) (pod, peer string) {
	if os.Geteuid() != 0 {
		t.Fatal("network integration tests create network namespaces and must run as root")
	}
	sfx := strconv.Itoa(os.Getpid())
	pod, peer = "cryo-nt-pod-"+sfx, "cryo-nt-peer-"+sfx
	for _, ns := range []string{pod, peer} {
		run(t, "ip", "netns", "add", ns)
		ns := ns
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", peer, "link", "add", "vp0", "type", "veth", "peer", "name", "eth0", "netns", pod)
	run(t, "ip", "-n", pod, "addr", "add", "10.77.0.2/24", "dev", "eth0")
	run(t, "ip", "-n", pod, "link", "set", "eth0", "mtu", "1400", "up")
	run(t, "ip", "-n", pod, "route", "add", "default", "via", "10.77.0.1")
	run(t, "ip", "-n", pod, "route", "add", "10.99.0.0/16", "via", "10.77.0.1", "metric", "5")
	run(t, "ip", "-n", peer, "addr", "add", "10.77.0.1/24", "dev", "vp0")
	run(t, "ip", "-n", peer, "link", "set", "vp0", "up")
	return "/run/netns/" + pod, peer
}

func macOf(t *testing.T, ns, dev string) net.HardwareAddr {
	out := run(t, "ip", "-n", ns, "-br", "link", "show", dev)
	f := strings.Fields(out)
	if len(f) < 3 {
		t.Fatalf("ip link show %s: %q", dev, out)
	}
	mac, err := net.ParseMAC(f[2])
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

func TestSetupBridgesVethAndTap(t *testing.T) {
	podPath, peer := netnsPair(t)
	pod := strings.TrimPrefix(podPath, "/run/netns/")
	podMAC, peerMAC := macOf(t, pod, "eth0"), macOf(t, peer, "vp0")
	ctx := context.Background()

	ep, err := Setup(ctx, podPath, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ep.Teardown(ctx) })
	if ep.Name != "eth0" || ep.MAC.String() != podMAC.String() || ep.MTU != 1400 {
		t.Fatalf("endpoint = %s %s mtu %d, want eth0 %s mtu 1400", ep.Name, ep.MAC, ep.MTU, podMAC)
	}
	if len(ep.Addresses) != 1 || ep.Addresses[0] != "10.77.0.2/24" {
		t.Fatalf("addresses = %v", ep.Addresses)
	}
	rs := map[string]Route{}
	for _, r := range ep.Routes {
		rs[r.Destination] = r
	}
	if r := rs[""]; r.Gateway != "10.77.0.1" || r.Device != "eth0" {
		t.Fatalf("routes %+v: no default route via 10.77.0.1", ep.Routes)
	}
	if r := rs["10.99.0.0/16"]; r.Gateway != "10.77.0.1" || r.Metric != 5 {
		t.Fatalf("routes %+v: no 10.99.0.0/16 via 10.77.0.1 metric 5", ep.Routes)
	}
	if _, ok := rs["10.77.0.0/24"]; ok {
		t.Fatalf("routes %+v include the kernel's subnet route", ep.Routes)
	}
	for _, dev := range []string{"eth0", "tap0_cryo"} {
		out := run(t, "ip", "netns", "exec", pod, "tc", "filter", "show", "dev", dev, "ingress")
		other := map[string]string{"eth0": "tap0_cryo", "tap0_cryo": "eth0"}[dev]
		if !strings.Contains(out, "u32") || !strings.Contains(out, "Redirect to device "+other) {
			t.Fatalf("tc filters on %s:\n%s\nwant a u32 redirect to %s", dev, out, other)
		}
	}
	if out := run(t, "ip", "-n", pod, "link", "show", "tap0_cryo"); !strings.Contains(out, "mtu 1400") || !strings.Contains(out, "UP") {
		t.Fatalf("tap: %s", out)
	}

	// peer -> veth -> tap: the peer's ARP request for the pod IP arrives on
	// the tap, i.e. where the guest NIC would see it.
	ping := exec.Command("ip", "netns", "exec", peer, "busybox", "ping", "-c", "20", "-i", "0.2", "10.77.0.2")
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ping.Process.Kill(); _ = ping.Wait() })
	buf := make([]byte, 65536)
	if err := ep.Tap.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var req []byte
	for req == nil {
		n, err := ep.Tap.Read(buf)
		if err != nil {
			t.Fatalf("no ARP request for 10.77.0.2 on the tap: %v\n%s\n%s", err,
				run(t, "ip", "netns", "exec", pod, "tc", "-s", "filter", "show", "dev", "eth0", "ingress"),
				run(t, "ip", "-n", pod, "-s", "link", "show"))
		}
		f := buf[vnetHdrLen:n]
		if len(f) >= 42 && binary.BigEndian.Uint16(f[12:14]) == 0x0806 && bytes.Equal(f[38:42], net.IPv4(10, 77, 0, 2).To4()) {
			req = f
		}
	}
	if !bytes.Equal(req[6:12], peerMAC) {
		t.Fatalf("ARP request from %s, want the peer's %s", net.HardwareAddr(req[6:12]), peerMAC)
	}

	// tap -> veth -> peer: the "guest's" ARP reply reaches the peer, whose
	// neighbour table then holds the pod IP at the pod MAC.
	reply := make([]byte, vnetHdrLen, vnetHdrLen+42)
	reply = append(reply, peerMAC...)
	reply = append(reply, podMAC...)
	reply = append(reply, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2)
	reply = append(reply, podMAC...)
	reply = append(reply, 10, 77, 0, 2)
	reply = append(reply, peerMAC...)
	reply = append(reply, 10, 77, 0, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := ep.Tap.Write(reply); err != nil {
			t.Fatalf("write to tap: %v", err)
		}
		out := run(t, "ip", "-n", peer, "neigh", "show", "10.77.0.2")
		if strings.Contains(out, podMAC.String()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("peer's neighbour entry for 10.77.0.2 = %q, want lladdr %s", out, podMAC)
		}
		time.Sleep(200 * time.Millisecond)
	}

	if err := ep.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("ip", "-n", pod, "link", "show", "tap0_cryo").Run(); err == nil {
		t.Fatal("tap0_cryo still exists after Teardown")
	}
	if out := run(t, "ip", "netns", "exec", pod, "tc", "qdisc", "show", "dev", "eth0"); strings.Contains(out, "ingress") {
		t.Fatalf("ingress qdisc left on eth0 after Teardown:\n%s", out)
	}
	if err := ep.Teardown(ctx); err != nil {
		t.Fatalf("second Teardown: %v", err)
	}
}

// A restored guest keeps its NIC's MAC: the new pod's veth takes it over for
// the endpoint's lifetime.
func TestSetupGivesVethTheGuestMAC(t *testing.T) {
	podPath, _ := netnsPair(t)
	pod := strings.TrimPrefix(podPath, "/run/netns/")
	orig := macOf(t, pod, "eth0")
	guest, _ := net.ParseMAC("02:c0:00:00:00:42")
	ctx := context.Background()
	ep, err := Setup(ctx, podPath, Options{MAC: guest, TapName: "tap1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ep.Teardown(ctx) })
	if ep.MAC.String() != guest.String() || macOf(t, pod, "eth0").String() != guest.String() {
		t.Fatalf("endpoint mac %s, veth mac %s, want %s", ep.MAC, macOf(t, pod, "eth0"), guest)
	}
	if err := exec.Command("ip", "-n", pod, "link", "show", "tap1").Run(); err != nil {
		t.Fatalf("tap1 not created: %v", err)
	}
	if err := ep.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := macOf(t, pod, "eth0"); got.String() != orig.String() {
		t.Fatalf("veth mac after Teardown = %s, want its own %s back", got, orig)
	}
}

func TestSetupWithoutCNIInterface(t *testing.T) {
	name := "cryo-nt-empty-" + strconv.Itoa(os.Getpid())
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	_, err := Setup(context.Background(), "/run/netns/"+name, Options{})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("Setup in a netns with only lo: %v, want not found", err)
	}
	if out := run(t, "ip", "-n", name, "link", "show"); strings.Contains(out, "tap0_cryo") {
		t.Fatalf("tap left behind:\n%s", out)
	}
	if _, err := Setup(context.Background(), "/run/netns/no-such-ns-cryo", Options{}); !errdefs.IsNotFound(err) {
		t.Fatalf("Setup in a missing netns: %v, want not found", err)
	}
}

// A restored guest's frames are held off the pod network until it has taken
// the veth's MAC: its tap has no redirect until ReleaseGuest.
func TestSetupHoldsGuestUntilReleased(t *testing.T) {
	podPath, _ := netnsPair(t)
	pod := strings.TrimPrefix(podPath, "/run/netns/")
	ctx := context.Background()
	ep, err := Setup(ctx, podPath, Options{HoldGuest: true, TapName: "tap2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ep.Teardown(ctx) })
	filters := func(dev string) string {
		return run(t, "ip", "netns", "exec", pod, "tc", "filter", "show", "dev", dev, "ingress")
	}
	if out := filters("tap2"); strings.Contains(out, "mirred") {
		t.Fatalf("a held guest's tap redirects already:\n%s", out)
	}
	if out := filters("eth0"); !strings.Contains(out, "mirred") {
		t.Fatalf("the pod network does not reach a held guest:\n%s", out)
	}
	if err := ep.ReleaseGuest(ctx); err != nil {
		t.Fatal(err)
	}
	if out := filters("tap2"); !strings.Contains(out, "mirred") {
		t.Fatalf("the tap does not redirect after ReleaseGuest:\n%s", out)
	}
	if err := ep.ReleaseGuest(ctx); err != nil {
		t.Fatalf("second ReleaseGuest: %v", err)
	}
}
