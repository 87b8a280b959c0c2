// Package shimapi is the generated ttrpc API that cryo's shim serves for
// cryoctl (cryo.proto), beside containerd's task service.
//
// Regenerate with `go generate ./shim/api/v1`; it needs protoc,
// protoc-gen-go v1.36.12 and protoc-gen-go-ttrpc v1.2.10 on PATH. The
// generated files are checked in.
package shimapi

//go:generate protoc -I . -I /usr/include --go_out=. --go_opt=paths=source_relative --go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative cryo.proto
