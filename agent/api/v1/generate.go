// Package agentapi is the generated host<->guest ttrpc API of cryo (agent.proto).
//
// Regenerate with `go generate ./agent/api/v1` after editing agent.proto; it needs
// protoc, protoc-gen-go v1.36.12 and protoc-gen-go-ttrpc v1.2.10 on PATH. The
// generated files are checked in.
package agentapi

//go:generate protoc -I . -I /usr/include --go_out=. --go_opt=paths=source_relative --go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative agent.proto
