// Pins Kubeflow Trainer's module: its CRDs (manifests/base/crds) are the reference schemas of the API.
module trainjob.local/cluster/kubeflow

go 1.24.0

require github.com/kubeflow/trainer/v2 v2.1.0
