//go:build tools

// Package tools pins the upstream command that scripts/cluster/build.sh builds: kubectl, for the tests that use
// the seeds' kubectl workflows as written.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubectl"
)
