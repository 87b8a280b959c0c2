// Command criconfig prints the CRI plugin sections of a containerd config
// with cryo as the default handler (stack.CRIConfig), for hack/demo-cri.sh:
// the integration tests write the same sections.
//
//	criconfig -pause IMAGE -cryo-config FILE -cni-bin DIR -cni-conf DIR [-runc-root DIR]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/cryo-runtime/cryo/stack"
)

func main() {
	var c stack.CRIConfig
	flag.StringVar(&c.PauseImage, "pause", "", "sandbox (pause) image reference")
	flag.StringVar(&c.RegistryHosts, "registry-hosts", "", "hosts.toml directory of the image service (optional)")
	flag.StringVar(&c.CryoConfig, "cryo-config", "", "cryo config file of the handler")
	flag.StringVar(&c.CNIBinDir, "cni-bin", "", "directory of the CNI plugins")
	flag.StringVar(&c.CNIConfDir, "cni-conf", "", "directory of the CNI network list")
	flag.StringVar(&c.RuncRoot, "runc-root", "", "add the handler runc, with runc's state in this directory (optional)")
	flag.Parse()
	if c.PauseImage == "" || c.CryoConfig == "" || c.CNIBinDir == "" || c.CNIConfDir == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	fmt.Print(c.TOML())
}
