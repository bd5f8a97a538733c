// Pins sigs.k8s.io/scheduler-plugins, whose cmd/scheduler (kube-scheduler with the Coscheduling plugin) the gang
// scheduling test runs beside kube-scheduler. Its release line follows Kubernetes' (v0.34.x is built on v1.34.x, the
// cluster's ../kubernetes). Its go.mod has replace lines, so build.sh builds cmd/scheduler inside a copy of the
// module rather than from here.
module trainjob.local/cluster/scheduler-plugins

go 1.24.0

require sigs.k8s.io/scheduler-plugins v0.34.7
