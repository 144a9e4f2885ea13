//go:build tools

// Package tools pins etcdutl's own main package (the module root) for `go build`: the
// etcdutl module replaces its sibling modules by relative path, so this module requires
// the published ones at the same version instead.
package tools

import (
	_ "go.etcd.io/etcd/etcdutl/v3"
)
