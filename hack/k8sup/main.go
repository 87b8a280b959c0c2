// Command k8sup runs a one-node Kubernetes control plane (stack.StartK8s:
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet)
// on a containerd with CRI in a network namespace, for hack/demo-k8s.sh:
// the integration tests start the same one. With -s3-addr it also runs
// versitygw there (stack.StartS3With, as the tests' K8s Env does), and
// with -controller-overlay it writes the kustomization over
// packaging/kubernetes/controller that fits the controller's Deployment to
// this cluster (stack.WriteControllerOverlay, as the tests do).
//
// Once the node is Ready it prints shell assignments (KUBECONFIG, S3_*,
// CONTROLLER_OVERLAY) for the demo to source, and on SIGINT or SIGTERM
// stops everything and undoes the kubelet's host changes.
//
//	k8sup -dir DIR -netns /run/netns/NAME -cri-socket SOCK [-node-ip IP] [-node-name NAME]
//	      [-cgroup-root /NAME] [-s3-addr IP:PORT] [-controller-overlay DIR -controller-base DIR -default-store URL]
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
	var s3Addr, overlay, base, defaultStore string
	flag.StringVar(&o.Dir, "dir", "", "directory for the control plane's state (k8s/ below it)")
	flag.StringVar(&o.NetNS, "netns", "", "network namespace containerd runs in (path)")
	flag.StringVar(&o.CRISocket, "cri-socket", "", "containerd's socket")
	flag.StringVar(&o.NodeIP, "node-ip", "10.250.0.1", "node address, added to lo of the namespace")
	flag.StringVar(&o.NodeName, "node-name", "cryo-node", "node name")
	flag.StringVar(&o.CgroupRoot, "cgroup-root", "", "the kubelet's cgroupRoot, for the pods of runc (the caller removes it)")
	flag.StringVar(&s3Addr, "s3-addr", "", "run versitygw in the namespace on this address (after the node IP is up)")
	flag.StringVar(&overlay, "controller-overlay", "", "write the controller's kustomization for this cluster into this directory")
	flag.StringVar(&base, "controller-base", "packaging/kubernetes/controller", "the packaged controller kustomization")
	flag.StringVar(&defaultStore, "default-store", "", "the controller's CRYO_DEFAULT_STORE")
	flag.Parse()
	if o.Dir == "" || o.NetNS == "" || o.CRISocket == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, s3Addr, overlay, base, defaultStore); err != nil {
		fmt.Fprintln(os.Stderr, "k8sup:", err)
		os.Exit(1)
	}
}

// run starts the cluster (and versitygw), prints the assignments, waits
// for a signal and stops what it started, last first.
func run(ctx context.Context, o stack.K8sOptions, s3Addr, overlay, base, defaultStore string) (retErr error) {
	k, err := stack.StartK8s(ctx, o)
	if err != nil {
		return err
	}
	defer func() {
		if err := k.Close(); err != nil && retErr == nil {
			retErr = fmt.Errorf("close: %w", err)
		}
	}()
	fmt.Printf("KUBECONFIG=%s\n", k.Kubeconfig)
	if s3Addr != "" {
		// After the control plane: the node IP is on lo from then on.
		s, err := stack.StartS3With(ctx, stack.S3Options{Tools: o.Tools, Dir: o.Dir, NetNS: o.NetNS, Addr: s3Addr})
		if err != nil {
			return err
		}
		defer s.Close()
		fmt.Printf("S3_ENDPOINT=%s\nS3_ACCESS_KEY=%s\nS3_SECRET_KEY=%s\nS3_BUCKET=%s\n", s.Endpoint, s.AccessKey, s.SecretKey, s.Bucket)
	}
	if overlay != "" {
		err := k.WriteControllerOverlay(ctx, overlay, base, stack.ControllerOverlay{Env: map[string]string{
			"KUBERNETES_SERVICE_HOST": o.NodeIP,
			"KUBERNETES_SERVICE_PORT": "6443",
			"CRYO_DEFAULT_STORE":      defaultStore,
		}})
		if err != nil {
			return err
		}
		fmt.Printf("CONTROLLER_OVERLAY=%s\n", overlay)
	}
	fmt.Println("READY=1")
	<-ctx.Done()
	return nil
}
