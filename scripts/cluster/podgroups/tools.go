//go:build tools

// Package tools pins what scripts/cluster/build.sh needs for the PodGroup CRDs: scheduler-plugins (its module
// ships the coscheduling CRD), Volcano's API types, and controller-gen, which generates Volcano's PodGroup CRD from
// those upstream types (volcano.sh/apis ships the types but not the CRD).
package tools

import (
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
	_ "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"
	_ "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
)
