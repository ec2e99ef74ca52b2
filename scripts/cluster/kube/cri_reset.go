package main

// cri-reset: stops and removes every pod sandbox of a container runtime through the CRI,
// as the kubelet does when it deletes a pod (containers stopped, the CNI DEL run, the pod's
// network namespace released). scripts/cluster.sh down runs it after stopping the kubelet,
// so that no pod process, veth or mount outlives the cluster. It is not an upstream
// component: upstream leaves this to crictl (`crictl rmp -fa`), which is not packaged here.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	criremote "k8s.io/cri-client/pkg"
)

func runCRIReset() int {
	fs := flag.NewFlagSet("cri-reset", flag.ExitOnError)
	endpoint := fs.String("endpoint", "", "CRI endpoint, e.g. unix:///run/containerd/containerd.sock")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	_ = fs.Parse(os.Args[1:])
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "cri-reset: --endpoint is required")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rt, err := criremote.NewRemoteRuntimeService(ctx, *endpoint, 10*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-reset: connecting to %s: %v\n", *endpoint, err)
		return 1
	}
	sandboxes, err := rt.ListPodSandbox(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-reset: listing pod sandboxes: %v\n", err)
		return 1
	}
	failed := 0
	for _, sb := range sandboxes {
		name := sb.GetMetadata().GetNamespace() + "/" + sb.GetMetadata().GetName()
		if err := rt.StopPodSandbox(ctx, sb.GetId()); err != nil {
			fmt.Fprintf(os.Stderr, "cri-reset: stopping %s: %v\n", name, err)
			failed++
			continue
		}
		if err := rt.RemovePodSandbox(ctx, sb.GetId()); err != nil {
			fmt.Fprintf(os.Stderr, "cri-reset: removing %s: %v\n", name, err)
			failed++
			continue
		}
		fmt.Printf("removed pod sandbox %s\n", name)
	}
	if failed > 0 {
		return 1
	}
	return 0
}
