// coredns: the cluster DNS of the local cluster (scripts/cluster.sh), built from
// github.com/coredns/coredns through the Go module proxy with only the plugins its Corefile
// uses (scripts/cluster/manifests/coredns.yaml), in CoreDNS's own plugin order, instead of
// the ~60 of the upstream binary: the same server, a third of the build.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The plugins, in the order of upstream's plugin.cfg (the order a query runs through them).
var directives = []string{
	"reload", "ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes",
	"loop", "forward",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
