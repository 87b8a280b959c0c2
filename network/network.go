// Package network connects a sandbox VM to its pod's network the way Kata's
// tcfilter model does: in the pod's network namespace (made by CRI, with a
// veth from CNI) it creates a tap device and redirects every frame between
// the veth and the tap with tc ingress qdiscs and match-all u32 filters with
// a mirred redirect action. QEMU serves the tap (as an open file descriptor)
// as the guest's virtio-net NIC, and the guest takes the veth's MAC,
// addresses and routes, so the pod IP and ARP keep working unchanged.
package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cryo-runtime/cryo/internal/netdump"
)

// DefaultTapName is the tap created in the pod's network namespace.
const DefaultTapName = "tap0_cryo"

// Endpoint is the pod's network as the guest sees it, and the tap that
// carries it. Tap stays open until Teardown; QEMU gets it as a descriptor.
type Endpoint struct {
	NetNS   string   // path of the pod's network namespace
	Name    string   // the CNI interface in the pod netns ("eth0"); the guest NIC gets the same name
	TapName string   // the tap created in the pod netns
	Tap     *os.File // opened with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR
	// MAC is the address the guest NIC must use: the veth's own, or
	// Options.MAC (which the veth then takes).
	MAC       net.HardwareAddr
	MTU       int
	Addresses []string // CIDR, e.g. "10.88.5.3/24"
	Routes    []Route

	origMAC net.HardwareAddr // the veth's MAC before Setup changed it
	held    bool             // the tap's frames are not redirected yet (Options.HoldGuest)
}

// Route is a route of the pod netns, in the guest agent's terms.
type Route struct {
	Destination string // CIDR; empty for a default route
	Gateway     string // empty for a link route
	Device      string
	Source      string
	Metric      int
}

// Options change what Setup does.
type Options struct {
	// TapName is the tap's name; DefaultTapName when empty.
	TapName string
	// MAC, when set, is given to the veth instead of reading the veth's: a
	// guest restored from a snapshot keeps the NIC address it had when it
	// was checkpointed, and the new pod's veth takes it over.
	MAC net.HardwareAddr
	// HoldGuest keeps the guest's frames off the pod network until
	// ReleaseGuest: a restored guest sends with the MAC it had at
	// checkpoint time until it takes the veth's, and one frame with its
	// source's MAC would teach the bridge to send the source's traffic to
	// this pod.
	HoldGuest bool
}

// Setup bridges the pod network namespace at nsPath to a new tap and
// returns the endpoint. It fails with errdefs.ErrNotFound when the netns has
// no interface but loopback (no CNI network), and leaves nothing behind on
// failure.
func Setup(ctx context.Context, nsPath string, opts Options) (_ *Endpoint, retErr error) {
	if opts.TapName == "" {
		opts.TapName = DefaultTapName
	}
	h, closeH, err := handleAt(nsPath)
	if err != nil {
		return nil, err
	}
	defer closeH()
	links, err := netdump.Retry(h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links in %s: %w", nsPath, err)
	}
	veth, err := pickLink(links, opts.TapName)
	if err != nil {
		return nil, fmt.Errorf("pod netns %s: %w", nsPath, err)
	}
	va := veth.Attrs()
	ep := &Endpoint{NetNS: nsPath, Name: va.Name, TapName: opts.TapName, MAC: va.HardwareAddr, MTU: va.MTU}
	addrs, err := netdump.Retry(func() ([]netlink.Addr, error) { return h.AddrList(veth, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", va.Name, err)
	}
	ep.Addresses = addresses(addrs)
	rs, err := netdump.Retry(func() ([]netlink.Route, error) { return h.RouteList(veth, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("routes of %s: %w", va.Name, err)
	}
	ep.Routes = routes(rs, va.Name)

	if ep.Tap, err = openTap(nsPath, opts.TapName); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			ep.teardown(h)
		}
	}()
	if opts.MAC != nil && opts.MAC.String() != va.HardwareAddr.String() {
		if err := h.LinkSetHardwareAddr(veth, opts.MAC); err != nil {
			return nil, fmt.Errorf("give %s the guest's mac %s: %w", va.Name, opts.MAC, err)
		}
		ep.origMAC, ep.MAC = va.HardwareAddr, opts.MAC
	}
	tap, err := h.LinkByName(opts.TapName)
	if err != nil {
		return nil, fmt.Errorf("find tap %s: %w", opts.TapName, err)
	}
	if err := h.LinkSetMTU(tap, ep.MTU); err != nil {
		return nil, fmt.Errorf("set mtu of %s: %w", opts.TapName, err)
	}
	if err := h.LinkSetUp(tap); err != nil {
		return nil, fmt.Errorf("set %s up: %w", opts.TapName, err)
	}
	if err := redirect(h, va.Index, tap.Attrs().Index); err != nil {
		return nil, fmt.Errorf("redirect %s to %s: %w", va.Name, opts.TapName, err)
	}
	if opts.HoldGuest {
		ep.held = true
	} else if err := redirect(h, tap.Attrs().Index, va.Index); err != nil {
		return nil, fmt.Errorf("redirect %s to %s: %w", opts.TapName, va.Name, err)
	}
	log.G(ctx).WithFields(log.Fields{
		"netns": nsPath, "veth": va.Name, "tap": opts.TapName, "mac": ep.MAC.String(), "addresses": ep.Addresses,
	}).Debug("pod network bridged to tap")
	return ep, nil
}

// ReleaseGuest passes the guest's frames to the pod network, after Setup
// with HoldGuest. It does nothing otherwise.
func (ep *Endpoint) ReleaseGuest(ctx context.Context) error {
	if ep == nil || !ep.held {
		return nil
	}
	h, closeH, err := handleAt(ep.NetNS)
	if err != nil {
		return err
	}
	defer closeH()
	veth, err := h.LinkByName(ep.Name)
	if err != nil {
		return fmt.Errorf("find %s: %w", ep.Name, err)
	}
	tap, err := h.LinkByName(ep.TapName)
	if err != nil {
		return fmt.Errorf("find tap %s: %w", ep.TapName, err)
	}
	if err := redirect(h, tap.Attrs().Index, veth.Attrs().Index); err != nil {
		return fmt.Errorf("redirect %s to %s: %w", ep.TapName, ep.Name, err)
	}
	ep.held = false
	return nil
}

// Teardown removes the tc redirection and the tap, gives the veth its MAC
// back, and closes the tap descriptor. The pod netns or its veth may already
// be gone (CNI DEL); that is not an error. Teardown is idempotent.
func (ep *Endpoint) Teardown(ctx context.Context) error {
	if ep == nil || ep.Tap == nil {
		return nil
	}
	h, closeH, err := handleAt(ep.NetNS)
	if err != nil {
		// The netns is gone, and the tap and qdiscs with it.
		ep.Tap.Close()
		ep.Tap = nil
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	}
	defer closeH()
	ep.teardown(h)
	return nil
}

func (ep *Endpoint) teardown(h *netlink.Handle) {
	if veth, err := h.LinkByName(ep.Name); err == nil {
		_ = h.QdiscDel(ingress(veth.Attrs().Index))
		if ep.origMAC != nil {
			_ = h.LinkSetHardwareAddr(veth, ep.origMAC)
		}
	}
	if tap, err := h.LinkByName(ep.TapName); err == nil {
		_ = h.QdiscDel(ingress(tap.Attrs().Index))
	}
	// The tap is not persistent: it disappears when its last descriptor
	// (ours, QEMU's) is closed. Delete it now in case QEMU still holds one.
	if ep.Tap != nil {
		ep.Tap.Close()
		ep.Tap = nil
	}
	if tap, err := h.LinkByName(ep.TapName); err == nil {
		_ = h.LinkDel(tap)
	}
}

// handleAt returns a netlink handle working in the netns at path.
func handleAt(path string) (*netlink.Handle, func(), error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("pod netns %s: %w", path, errdefs.ErrNotFound)
		}
		return nil, nil, fmt.Errorf("open pod netns %s: %w", path, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, func() { h.Close(); ns.Close() }, nil
}

func ingress(index int) *netlink.Ingress {
	return &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS,
	}}
}

// redirect sends every frame arriving on link from out of link to.
func redirect(h *netlink.Handle, from, to int) error {
	if err := h.QdiscAdd(ingress(from)); err != nil {
		return fmt.Errorf("add ingress qdisc: %w", err)
	}
	return h.FilterAdd(redirectFilter(from, to))
}

// redirectFilter is a u32 filter without selector (match all: the netlink
// library adds an empty terminal key) whose mirred action steals the frame
// and sends it out of link to.
func redirectFilter(from, to int) *netlink.U32 {
	return &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from,
			Parent:    netlink.MakeHandle(0xffff, 0),
			Protocol:  unix.ETH_P_ALL,
			Priority:  1,
		},
		Actions: []netlink.Action{&netlink.MirredAction{
			ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_STOLEN},
			MirredAction: netlink.TCA_EGRESS_REDIR,
			Ifindex:      to,
		}},
	}
}
