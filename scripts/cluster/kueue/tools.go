//go:build tools

// Package tools pins the upstream command that scripts/cluster/build.sh builds: Kueue's controller manager, the
// job queueing system whose TrainJob integration admits, suspends and preempts TrainJobs (tests/harness/kubetest/kueue.py).
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
