// Command mkimage writes an OCI layout tar that `ctr image import` accepts,
// with no Docker and no registry: the small busybox test image, (-bin)
// the image of one static Go program such as cryo-controller, or
// (-e2b-template) an E2B template on busybox (busybox.E2BTemplate).
//
//	go run ./hack/mkimage OUT.tar NAME [CMD...]
//	go run ./hack/mkimage -bin FILE OUT.tar NAME [ARG...]
//	go run ./hack/mkimage -e2b-template OUT.tar NAME [CMD...]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cryo-runtime/cryo/internal/busybox"
)

// nonRoot is the user a program's image runs as (distroless's "nonroot"):
// a pod that asks runAsNonRoot needs a numeric one.
const nonRoot = "65532:65532"

func main() {
	bin := flag.String("bin", "", "a static binary: write an image of it alone (entrypoint /NAME, user "+nonRoot+") instead of busybox")
	e2b := flag.Bool("e2b-template", false, "an E2B template: busybox with every applet, E2B's user \"user\" and a /bin/bash")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: mkimage [-bin FILE | -e2b-template] OUT.tar NAME [CMD or ARG...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 2 {
		flag.Usage()
		os.Exit(2)
	}
	out, name, args := flag.Arg(0), flag.Arg(1), flag.Args()[2:]
	spec := busybox.Spec{Name: name, Cmd: args}
	if *bin == "" && len(args) == 0 {
		spec.Cmd = []string{"/bin/sh"}
	}
	if *e2b {
		spec = busybox.E2BTemplate(name, spec.Cmd)
	}
	if *bin != "" {
		var err error
		if spec, err = programSpec(*bin, name, args); err != nil {
			fmt.Fprintln(os.Stderr, "mkimage:", err)
			os.Exit(1)
		}
	}
	if err := busybox.WriteSpecFile(out, spec); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// programSpec is the image of the binary at path alone: /<its name> as the
// entrypoint (args its default arguments), a writable /tmp (a webhook
// server's certificates go there), and a user and group that are not root.
func programSpec(path, name string, args []string) (busybox.Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return busybox.Spec{}, err
	}
	if len(b) < 4 || string(b[:4]) != "\x7fELF" {
		return busybox.Spec{}, fmt.Errorf("%s is not an ELF binary", path)
	}
	base := filepath.Base(path)
	return busybox.Spec{
		Name: name, Bare: true, Entrypoint: []string{"/" + base}, Cmd: args, User: nonRoot,
		Files: []busybox.File{
			{Path: base, Mode: 0o755, Content: string(b)},
			{Path: "tmp", Mode: 0o1777, Dir: true},
			{Path: "etc", Mode: 0o755, Dir: true},
			{Path: "etc/passwd", Mode: 0o644, Content: "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
			{Path: "etc/group", Mode: 0o644, Content: "root:x:0:\nnonroot:x:65532:\n"},
		},
	}, nil
}
