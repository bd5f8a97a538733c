//go:build tools

// Package tools pins the upstream command that scripts/cluster/build.sh builds: kwok, which simulates nodes and
// the life cycle of their pods against a real API server (the benchmarks' and the KWOK test's simulated nodes).
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
