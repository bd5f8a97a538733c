//go:build tools

// Package tools pins the node's upstream commands that scripts/cluster/build.sh builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
