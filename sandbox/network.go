package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/cryo-runtime/cryo/agent/api/v1"
	"github.com/cryo-runtime/cryo/network"
	"github.com/cryo-runtime/cryo/vmm"
)

// podNetwork is a sandbox's network: the CNI veth of the pod's netns
// bridged to a tap that QEMU serves as the guest's NIC. A nil *podNetwork is
// a sandbox without network (ctr, host-network pods): every method is a
// no-op on it.
type podNetwork struct {
	ep *network.Endpoint
}

// guestNICID is the QEMU device id of the pod NIC.
const guestNICID = "net0"

// podNetNS returns the path of the network namespace the spec joins, or ""
// when it makes a new one or shares the host's.
func podNetNS(spec *specs.Spec) string {
	if spec.Linux == nil {
		return ""
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// setupNetwork bridges the pod netns named in the sandbox container's spec
// (CRI sets it to the netns CNI configured) to a tap. It returns nil for a
// spec without a netns path and for a netns without interfaces besides
// loopback. A restored guest's NIC still has the MAC it had at checkpoint
// time; UpdateInterface gives it the new pod's veth's MAC, addresses and
// routes.
func setupNetwork(ctx context.Context, spec *specs.Spec, opts network.Options) (*podNetwork, error) {
	path := podNetNS(spec)
	if path == "" {
		return nil, nil
	}
	ep, err := network.Setup(ctx, path, opts)
	if errors.Is(err, errdefs.ErrNotFound) {
		log.G(ctx).WithError(err).WithField("netns", path).Info("pod has no network interface: vm gets no nic")
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("set up pod network: %w", err)
	}
	return &podNetwork{ep: ep}, nil
}

// nics returns the NICs for the VM's config.
func (n *podNetwork) nics() []vmm.NIC {
	if n == nil {
		return nil
	}
	return []vmm.NIC{{ID: guestNICID, Tap: n.ep.Tap, MAC: n.ep.MAC.String()}}
}

// configureGuest gives the guest NIC the pod's name, addresses, MTU and
// routes. Call it once the agent answers (after a boot or a restore).
func (n *podNetwork) configureGuest(ctx context.Context, ag networkGuest) error {
	if n == nil {
		return nil
	}
	iface, routes := guestNetworkRequests(n.ep)
	if err := ag.updateNetwork(ctx, iface, routes); err != nil {
		return fmt.Errorf("configure guest network %s: %w", n.ep.Name, err)
	}
	return nil
}

func guestNetworkRequests(ep *network.Endpoint) (*agentapi.UpdateInterfaceRequest, *agentapi.UpdateRoutesRequest) {
	iface := &agentapi.UpdateInterfaceRequest{
		Mac: ep.MAC.String(), Name: ep.Name, Addresses: ep.Addresses, Mtu: uint32(ep.MTU),
	}
	routes := &agentapi.UpdateRoutesRequest{}
	for _, r := range ep.Routes {
		routes.Routes = append(routes.Routes, &agentapi.Route{
			Destination: r.Destination, Gateway: r.Gateway, Device: r.Device, Source: r.Source, Metric: uint32(r.Metric),
		})
	}
	return iface, routes
}

// releaseGuest lets a guest that was held back (a restore) reach the pod
// network.
func (n *podNetwork) releaseGuest(ctx context.Context) error {
	if n == nil {
		return nil
	}
	if err := n.ep.ReleaseGuest(ctx); err != nil {
		return fmt.Errorf("release guest network %s: %w", n.ep.Name, err)
	}
	return nil
}

// teardown undoes setupNetwork; after the VM is gone. Idempotent.
func (n *podNetwork) teardown(ctx context.Context) {
	if n == nil {
		return
	}
	if err := n.ep.Teardown(ctx); err != nil {
		log.G(ctx).WithError(err).WithField("netns", n.ep.NetNS).Warn("tear down pod network")
	}
}

// networkGuest is the part of the agent API that configures the pod
// network in the guest.
type networkGuest interface {
	updateNetwork(ctx context.Context, iface *agentapi.UpdateInterfaceRequest, routes *agentapi.UpdateRoutesRequest) error
}

var _ networkGuest = (*agentClient)(nil)

func (a *agentClient) updateNetwork(ctx context.Context, iface *agentapi.UpdateInterfaceRequest, routes *agentapi.UpdateRoutesRequest) error {
	ctx, cancel := a.short(ctx)
	defer cancel()
	if _, err := a.api.UpdateInterface(ctx, iface); err != nil {
		return fmt.Errorf("update interface: %w", err)
	}
	if _, err := a.api.UpdateRoutes(ctx, routes); err != nil {
		return fmt.Errorf("update routes: %w", err)
	}
	return nil
}
