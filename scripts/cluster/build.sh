#!/usr/bin/env bash
# Builds the test cluster's upstream components from their Go modules, unmodified, at the versions pinned by the
# go.mod files beside this script:
#   etcd/        go.etcd.io/etcd/server/v3      (main.go calls etcdmain.Main)
#   kubernetes/  k8s.io/kubernetes              kube-apiserver, kube-controller-manager, kube-scheduler
#   kubectl/     k8s.io/kubernetes              kubectl, for the tests that run the seeds' kubectl commands as written
#   jobset/      sigs.k8s.io/jobset             the JobSet controller manager (serves jobset.x-k8s.io/v1alpha2)
#   kubeflow/    github.com/kubeflow/trainer/v2 its controller manager (run beside trainjob's operator by the
#                conformance tests), its CRDs (the reference schemas), RBAC, webhooks and built-in runtimes
#   jobset-current/, kubeflow-current/  the current JobSet and Kubeflow Trainer releases, in their place with
#                --current (benchmarks/reconcile.py --kubeflow current); the conformance tests keep the pins above
#   podgroups/   sigs.k8s.io/scheduler-plugins (its coscheduling PodGroup CRD), volcano.sh/apis (Volcano's
#                PodGroup types; controller-gen from sigs.k8s.io/controller-tools generates their CRD)
#   kwok/        sigs.k8s.io/kwok               kwok, which simulates nodes and moves their pods through their life
#                cycle (tests/harness/kubetest/kwok.py; the simulated-node test and `benchmarks/reconcile.py --kwok`)
#   kueue/       sigs.k8s.io/kueue              Kueue's controller manager with its TrainJob integration, its CRDs, RBAC and
#                webhooks (tests/harness/kubetest/kueue.py; the queue tests)
#   scheduler-plugins/ sigs.k8s.io/scheduler-plugins  its cmd/scheduler, kube-scheduler with the Coscheduling
#                plugin (tests/harness/kubetest/coscheduling.py; the gang scheduling test), built inside a copy
#                of its module (its go.mod has replace lines) on the cluster's Kubernetes patch version
#   node/        k8s.io/kubernetes              kubelet and kube-proxy, the test cluster's real nodes (same version and
#                ldflags as the control plane; tests/harness/kubetest/nodes.py), and the pause image's pause.c
#   coredns/     github.com/coredns/coredns     the cluster DNS (the kube-dns Service) the nodes' pods resolve names with
#   cri-tools/   sigs.k8s.io/cri-tools          crictl, with which the harness looks at and cleans up a node's containers
# Binaries are cached by component and by a hash of its go.mod/go.sum and the Go version, under
# ${TRAINJOB_CLUSTER_CACHE:-~/.cache/trainjob/cluster}, so a warm run takes seconds. Manifests that the tests
# need (CRDs, JobSet's RBAC and webhook paths) are copied from the module cache next to the binaries.
# Prints the path of manifest.json, which names every binary and file. With --manifests-only, only the manifests
# are prepared (no etcd, Kubernetes or JobSet binaries): what the schema tests need. With --current, JobSet and
# Kubeflow Trainer are the current releases (jobset-current/, kubeflow-current/), named in manifest-current.json.
set -euo pipefail
manifests_only=0 current=""
for arg in "$@"; do
  case "$arg" in
    --manifests-only) manifests_only=1 ;;
    --current) current="-current" ;;
    *) echo "build.sh: unknown option $arg; expected --manifests-only and/or --current" >&2; exit 2 ;;
  esac
done
here="$(cd "$(dirname "$0")" && pwd)"
cache="${TRAINJOB_CLUSTER_CACHE:-$HOME/.cache/trainjob/cluster}"
mkdir -p "$cache"
command -v go >/dev/null || { echo "build.sh: Go is needed (https://go.dev/dl/); none on PATH" >&2; exit 2; }
# One build at a time per cache (test runs, benchmarks and a developer's shell may start it together): a second
# run waits, then finds everything done.
exec 9>"$cache/.lock"
flock 9
gover="$(go env GOVERSION)"
export GOFLAGS="${GOFLAGS:--mod=readonly}" CGO_ENABLED=0

log() { echo "build.sh: $*" >&2; }

# stamp DIR: a short hash of the module's pins and the toolchain, so a change to either rebuilds.
stamp() { cat "$1/go.mod" "$1/go.sum" | { cat; echo "$gover"; } | sha256sum | cut -c1-16; }

# build NAME MODULE_DIR PACKAGE...: builds into $cache/NAME-<stamp>/ unless it is there already. $ldflags_extra
# (part of the stamp) goes to the linker.
ldflags_extra=""
build() {
  local name="$1" dir="$here/$2"; shift 2
  local out="$cache/$name-$( { stamp "$dir"; echo "$ldflags_extra"; } | sha256sum | cut -c1-16)"
  [ -z "$ldflags_extra" ] && out="$cache/$name-$(stamp "$dir")"
  if [ -f "$out/.complete" ]; then
    echo "$out"; return
  fi
  log "building $name ($*) into $out"
  local start=$SECONDS
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$dir" && go build -trimpath -ldflags="-s -w $ldflags_extra" -o "$out.tmp/" "$@")
  touch "$out.tmp/.complete"
  rm -rf "$out" && mv -T "$out.tmp" "$out"
  log "built $name in $((SECONDS - start)) s"
  echo "$out"
}

# module_dir MODULE_DIR MODULE: where the Go module cache holds MODULE at the version MODULE_DIR pins.
module_dir() {
  (cd "$here/$1" && go mod download -json "$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
}

# version_of MODULE MODULE_DIR: the version of MODULE that MODULE_DIR/go.mod pins.
version_of() { sed -n "s|^require $1 \(v[^ ]*\)$|\1|p" "$here/$2/go.mod"; }

# build_scheduler_plugins: cmd/scheduler of the scheduler-plugins module that scheduler-plugins/ pins, built inside a
# writable copy of that module, since its go.mod has replace lines (which only apply in the main module). Those
# replace lines pin every k8s.io module at the release's own Kubernetes patch version; they are moved to the
# cluster's (kubernetes/go.mod; same minor version), whose modules and go.sum lines are here already, so that the
# scheduler is built on the Kubernetes the cluster runs (the module proxy here does not serve every k8s.io module
# at every patch version).
build_scheduler_plugins() {
  local out
  out="$cache/scheduler-plugins-$(cat "$here/scheduler-plugins/go.mod" "$here/scheduler-plugins/go.sum" \
    "$here/kubernetes/go.mod" | { cat; echo "$gover"; } | sha256sum | cut -c1-16)"
  if [ -f "$out/.complete" ]; then
    echo "$out"; return
  fi
  log "building scheduler-plugins (cmd/scheduler) into $out"
  local start=$SECONDS src work kv
  src="$(module_dir scheduler-plugins sigs.k8s.io/scheduler-plugins)"
  [ -n "$src" ] && [ -f "$src/go.mod" ] || { log "no module source for sigs.k8s.io/scheduler-plugins"; return 1; }
  kv="$(version_of k8s.io/kubernetes kubernetes)"
  work="$(mktemp -d)"
  cp -r "$src/." "$work/" && chmod -R u+w "$work"
  sed -i -E "s#^(\s*(replace )?k8s\.io/[a-z-]+ => k8s\.io/[a-z-]+ )v0\.[0-9]+\.[0-9]+\$#\1v0.${kv#v1.}#;
    s#^(\s*k8s\.io/kubernetes => k8s\.io/kubernetes )v1\.[0-9]+\.[0-9]+\$#\1$kv#" "$work/go.mod"
  cat "$here/kubernetes/go.sum" >> "$work/go.sum"
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$work" && GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o "$out.tmp/" ./cmd/scheduler) \
    || { rm -rf "$work"; return 1; }
  rm -rf "$work"
  touch "$out.tmp/.complete"
  rm -rf "$out" && mv -T "$out.tmp" "$out"
  log "built scheduler-plugins in $((SECONDS - start)) s"
  echo "$out"
}

# build_pause: the pause container's binary from the Kubernetes module's build/pause/linux/pause.c (static, as the
# upstream image has it); tests/harness/kubetest/images.py makes the pause image of it.
build_pause() {
  local src out
  src="$(module_dir node k8s.io/kubernetes)/build/pause/linux/pause.c"
  out="$cache/pause-$(cat "$src" | { cat; gcc --version | head -1; } | sha256sum | cut -c1-16)"
  if [ ! -f "$out/.complete" ]; then
    command -v gcc >/dev/null || { log "gcc is needed to build the pause container"; return 1; }
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    gcc -Os -Wall -Werror -static -DVERSION=v3.10-trainjob -o "$out.tmp/pause" "$src"
    strip "$out.tmp/pause"
    touch "$out.tmp/.complete"
    rm -rf "$out" && mv -T "$out.tmp" "$out"
  fi
  echo "$out"
}

if [ "$manifests_only" = 0 ]; then
  etcd_bin="$(build etcd etcd trainjob.local/cluster/etcd)"
  # The release's version, as Kubernetes' own build stamps it: clients that check the server's version (Kueue
  # refuses to start on an unparsable one) read it from /version.
  kv="$(version_of k8s.io/kubernetes kubernetes)"
  kminor="${kv#v1.}"; kminor="${kminor%%.*}"
  kube_ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X $pkg.gitVersion=$kv -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kminor -X $pkg.gitTreeState=clean"
  done
  ldflags_extra="$kube_ldflags"
  kube_bin="$(build kubernetes kubernetes \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler)"
  kubectl_bin="$(build kubectl kubectl k8s.io/kubernetes/cmd/kubectl)"
  node_bin="$(build node node k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)"
  ldflags_extra=""
  pause_bin="$(build_pause)"
  coredns_bin="$(build coredns coredns github.com/coredns/coredns)"
  crictl_bin="$(build cri-tools cri-tools sigs.k8s.io/cri-tools/cmd/crictl)"
  jobset_bin="$(build "jobset$current" "jobset$current" sigs.k8s.io/jobset)"
  kubeflow_bin="$(build "kubeflow-trainer$current" "kubeflow$current" \
    github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager)"
  kwok_bin="$(build kwok kwok sigs.k8s.io/kwok/cmd/kwok)"
  sp_bin="$(build_scheduler_plugins)"
  kueue_bin="$(build kueue kueue sigs.k8s.io/kueue/cmd/kueue)"
fi
controller_gen_bin="$(build controller-gen podgroups sigs.k8s.io/controller-tools/cmd/controller-gen)"

jobset_src="$(module_dir "jobset$current" sigs.k8s.io/jobset)"
trainer_src="$(module_dir "kubeflow$current" github.com/kubeflow/trainer/v2)"
sp_src="$(module_dir podgroups sigs.k8s.io/scheduler-plugins)"
kueue_src="$(module_dir kueue sigs.k8s.io/kueue)"

manifests="$cache/manifests$current-$(cat "$here"/*/go.mod "$0" | sha256sum | cut -c1-16)"
if [ ! -f "$manifests/.complete" ]; then
  rm -rf "$manifests.tmp" && mkdir -p "$manifests.tmp"/{jobset,kubeflow,podgroups,kueue}
  cp "$jobset_src"/config/components/crd/bases/*.yaml "$manifests.tmp/jobset/"
  cp "$jobset_src/config/components/rbac/role.yaml" "$manifests.tmp/jobset/rbac-role.yaml"
  cp "$jobset_src/config/components/webhook/manifests.yaml" "$manifests.tmp/jobset/webhooks.yaml"
  cp "$trainer_src"/manifests/base/crds/*.yaml "$manifests.tmp/kubeflow/"
  cp "$trainer_src/manifests/base/runtimes/torch_distributed.yaml" "$manifests.tmp/kubeflow/"
  mkdir -p "$manifests.tmp/kubeflow/runtimes"
  find "$trainer_src/manifests/base/runtimes" -name '*.yaml' ! -name kustomization.yaml \
    -exec cp {} "$manifests.tmp/kubeflow/runtimes/" \;
  cp "$trainer_src/manifests/base/rbac/role.yaml" "$manifests.tmp/kubeflow/rbac-role.yaml"
  cp "$trainer_src/manifests/base/webhook/manifests.yaml" "$manifests.tmp/kubeflow/webhooks.yaml"
  cp "$sp_src/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" "$manifests.tmp/podgroups/"
  cp "$kueue_src"/config/components/crd/bases/*.yaml "$manifests.tmp/kueue/"
  cp "$kueue_src/config/components/rbac/role.yaml" "$manifests.tmp/kueue/rbac-role.yaml"
  cp "$kueue_src/config/components/rbac/manager_secrets_role.yaml" "$manifests.tmp/kueue/rbac-secrets-role.yaml"
  cp "$kueue_src/config/components/webhook/manifests.yaml" "$manifests.tmp/kueue/webhooks.yaml"
  (cd "$here/podgroups" && "$controller_gen_bin/controller-gen" crd:crdVersions=v1 \
    paths=volcano.sh/apis/pkg/apis/scheduling/v1beta1 output:crd:dir="$manifests.tmp/podgroups")
  chmod -R u+w "$manifests.tmp"
  touch "$manifests.tmp/.complete"
  rm -rf "$manifests" && mv -T "$manifests.tmp" "$manifests"
fi

if [ "$manifests_only" = 1 ]; then
  echo "$manifests"
  exit 0
fi

cat > "$cache/manifest$current.json" <<EOF
{
  "go": "$gover",
  "versions": {
    "etcd": "$(version_of go.etcd.io/etcd/server/v3 etcd)",
    "kubernetes": "$(version_of k8s.io/kubernetes kubernetes)",
    "jobset": "$(version_of sigs.k8s.io/jobset "jobset$current")",
    "kubeflow-trainer": "$(version_of github.com/kubeflow/trainer/v2 "kubeflow$current")",
    "kwok": "$(version_of sigs.k8s.io/kwok kwok)",
    "scheduler-plugins": "$(version_of sigs.k8s.io/scheduler-plugins scheduler-plugins)",
    "kueue": "$(version_of sigs.k8s.io/kueue kueue)",
    "coredns": "$(version_of github.com/coredns/coredns coredns)",
    "cri-tools": "$(version_of sigs.k8s.io/cri-tools cri-tools)"
  },
  "binaries": {
    "etcd": "$etcd_bin/etcd",
    "kube-apiserver": "$kube_bin/kube-apiserver",
    "kube-controller-manager": "$kube_bin/kube-controller-manager",
    "kube-scheduler": "$kube_bin/kube-scheduler",
    "jobset": "$jobset_bin/jobset",
    "kubeflow-trainer": "$kubeflow_bin/trainer-controller-manager",
    "kubectl": "$kubectl_bin/kubectl",
    "kwok": "$kwok_bin/kwok",
    "scheduler-plugins": "$sp_bin/scheduler",
    "kueue": "$kueue_bin/kueue",
    "kubelet": "$node_bin/kubelet",
    "kube-proxy": "$node_bin/kube-proxy",
    "pause": "$pause_bin/pause",
    "coredns": "$coredns_bin/coredns",
    "crictl": "$crictl_bin/crictl"
  },
  "manifests": "$manifests"
}
EOF
echo "$cache/manifest$current.json"
