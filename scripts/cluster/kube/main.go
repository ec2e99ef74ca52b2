// kube: the upstream Kubernetes components in one multi-call binary, built from
// k8s.io/kubernetes through the Go module proxy for the local single-node cluster
// (scripts/cluster.sh). The component is chosen by the name it is called by
// (a symlink: kube-apiserver, kubelet, ...) or by the first argument
// (`kube kubelet --help`). Nothing here changes upstream behaviour: each entry is the
// body of that component's own cmd/<name>/main, so flags, defaults and logs are
// upstream's. One binary instead of six because the components share most of their
// packages: linking once saves minutes of a cold build on two cores.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as kube-apiserver and the controller-manager import it

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func() int{
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":                 func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kube-proxy":              func() int { return cli.Run(proxy.NewProxyCommand()) },
	"kubectl":                 runKubectl,
	"cri-reset":               runCRIReset,
}

func runKubectl() int {
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func names() []string {
	out := make([]string, 0, len(components))
	for name := range components {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func main() {
	name := filepath.Base(os.Args[0])
	run, ok := components[name]
	if !ok && len(os.Args) > 1 {
		if run, ok = components[os.Args[1]]; ok {
			// `kube kubelet --flags`: the component sees itself as argv[0].
			os.Args = os.Args[1:]
		}
	}
	if !ok {
		fmt.Fprintf(os.Stderr, "usage: kube COMPONENT [flags] (or call it through a symlink named after the component)\ncomponents: %v\n", names())
		os.Exit(2)
	}
	os.Exit(run())
}
