//go:build tools

// Package tools pins crictl, which scripts/cluster/build.sh builds.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
