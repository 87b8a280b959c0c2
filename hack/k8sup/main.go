// Command k8sup runs a one-node Kubernetes control plane (stack.StartK8s:
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet) on a containerd with CRI in a network
// namespace, for hack/demo-k8s.sh: the integration tests start the same
// one. It prints the kubeconfig's path once the node is Ready, and on
// SIGINT or SIGTERM stops everything and undoes the kubelet's host changes.
//
//	k8sup -dir DIR -netns /run/netns/NAME -cri-socket SOCK [-node-ip IP] [-node-name NAME]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/cryo-runtime/cryo/stack"
)

func main() {
	var o stack.K8sOptions
	flag.StringVar(&o.Dir, "dir", "", "directory for the control plane's state (k8s/ below it)")
	flag.StringVar(&o.NetNS, "netns", "", "network namespace containerd runs in (path)")
	flag.StringVar(&o.CRISocket, "cri-socket", "", "containerd's socket")
	flag.StringVar(&o.NodeIP, "node-ip", "10.250.0.1", "node address, added to lo of the namespace")
	flag.StringVar(&o.NodeName, "node-name", "cryo-node", "node name")
	flag.Parse()
	if o.Dir == "" || o.NetNS == "" || o.CRISocket == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	k, err := stack.StartK8s(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8sup:", err)
		os.Exit(1)
	}
	fmt.Println(k.Kubeconfig)
	<-ctx.Done()
	if err := k.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "k8sup: close:", err)
		os.Exit(1)
	}
}
