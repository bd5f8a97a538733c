//go:build tools

// Package tools pins Kubeflow Trainer's controller manager, which scripts/cluster/build.sh builds so that the
// conformance tests can run it beside trainjob's operator on the same inputs.
package tools

import _ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
