// Package shimapi is the generated ttrpc API that cryo's shim serves for
// cryoctl (cryo.proto), beside containerd's task service.
//
// Regenerate with `go generate ./shim/api/v1`; it needs protoc,
// protoc-gen-go v1.36.12 and protoc-gen-go-ttrpc v1.2.10 on PATH. The
// generated files are checked in.
package shimapi

//go:generate protoc -I . -I /usr/include --go_out=. --go_opt=paths=source_relative --go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative cryo.proto

// ExtensionSocket is the name, in a sandbox's state directory, of the
// socket on which the shim serves this API for cryoctl.
const ExtensionSocket = "cryo.sock"

// ContainersFile, in a sandbox's state directory, lists "<namespace>/<id>"
// of the sandbox's containers, one a line: cryoctl finds a sandbox by any
// of its containers.
const ContainersFile = "containers"
