//go:build tools

// Package tools pins the current Kubeflow Trainer release's controller manager, which scripts/cluster/build.sh
// builds with --current for the benchmarks that compare trainjob's operator with the release users install now.
package tools

import _ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
