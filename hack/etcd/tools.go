//go:build tools

// Package etcd only records, for go mod tidy, the command hack/tools.sh builds.
package etcd

import _ "go.etcd.io/etcd/server/v3"
