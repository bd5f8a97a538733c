//go:build tools

// Package tools pins the upstream JobSet command that scripts/cluster/build.sh builds.
package tools

import _ "sigs.k8s.io/jobset"
