// Builds etcd from go.etcd.io/etcd/server/v3. The etcd root module replaces its sibling
// modules by relative path, so this module requires the published ones instead.
module kontinuum.local/tools/etcd

go 1.26

require (
	go.etcd.io/etcd/api/v3 v3.6.16
	go.etcd.io/etcd/client/pkg/v3 v3.6.16
	go.etcd.io/etcd/client/v3 v3.6.16
	go.etcd.io/etcd/pkg/v3 v3.6.16
	go.etcd.io/etcd/server/v3 v3.6.16
)
