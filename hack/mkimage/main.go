// Command mkimage writes the small busybox test image as an OCI layout tar:
//
//	go run ./hack/mkimage OUT.tar NAME [CMD...]
package main

import (
	"fmt"
	"os"

	"github.com/cryo-runtime/cryo/internal/busybox"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: mkimage OUT.tar NAME [CMD...]")
		os.Exit(2)
	}
	cmd := os.Args[3:]
	if len(cmd) == 0 {
		cmd = []string{"/bin/sh"}
	}
	if err := busybox.WriteFile(os.Args[1], os.Args[2], cmd); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}
