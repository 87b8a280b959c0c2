// Package spec holds envd's wire contract: process.proto and
// filesystem.proto, the Connect services E2B's SDK calls in a sandbox, and
// the Go generated from them (checked in).
//
// Regenerate with `go generate ./agent/envd/spec` after editing a .proto; it
// needs protoc (Debian's protobuf-compiler), protoc-gen-go v1.36.12 and
// protoc-gen-connect-go v1.21.1 on PATH.
package spec

//go:generate protoc -I . -I /usr/include --go_out=. --go_opt=paths=source_relative --connect-go_out=. --connect-go_opt=paths=source_relative process/process.proto filesystem/filesystem.proto
