//go:build tools

// Package tools pins the current JobSet release (the one the current Kubeflow Trainer release needs), which
// scripts/cluster/build.sh builds with --current for the benchmarks.
package tools

import _ "sigs.k8s.io/jobset"
