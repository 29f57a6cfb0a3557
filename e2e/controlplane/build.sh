#!/usr/bin/env bash
# Builds a set of Kubernetes binaries from the Go module proxy with the
# machine's Go toolchain, into DEST (one directory per version and set, so each
# build happens once per machine).
#
# usage: build.sh DEST [SET]
#   SET controlplane (default): etcd, kube-apiserver, kube-controller-manager, kubectl
#   SET node: kubelet, kube-scheduler and pause (the sandbox program of the local
#             node of `agentq cluster up --node`)
#   SET helm: helm (charts/agentq's tests and `make e2e`)
#   SET keda: KEDA's operator and metrics adapter (e2e/test_keda.py), version in
#             ./keda/VERSION; its Go build cache (several GB) is kept beside DEST
#             ($(dirname DEST)/gocache), so a rebuild after a clean checkout is minutes
# The versions are the ones pinned in ./kubernetes/go.mod, ./etcd/go.mod,
# ./helm/go.mod and ./keda/VERSION.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: build.sh DEST [controlplane|node|helm|keda]}
set_name=${2:-controlplane}
command -v go >/dev/null || { echo "build.sh: 'go' is not on PATH; install Go >= 1.26" >&2; exit 3; }
case "$set_name" in
  controlplane) k8s_cmds="kube-apiserver kube-controller-manager kubectl" ;;
  node) k8s_cmds="kubelet kube-scheduler" ;;
  helm|keda) k8s_cmds="" ;;
  *) echo "build.sh: unknown set '$set_name' (controlplane, node, helm or keda)" >&2; exit 2 ;;
esac

k8s_version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/kubernetes/go.mod")
etcd_version=$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$here/etcd/go.mod")
minor=$(echo "$k8s_version" | cut -d. -f2)
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

# The same version stamps upstream's hack/lib/version.sh sets, so /version is right.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

export CGO_ENABLED=0 GOFLAGS=-mod=mod
if [ "$set_name" = helm ]; then
  # The version stamp helm's own Makefile sets for a release (`helm version`).
  helm_version=$(awk '$1=="require" && $2=="helm.sh/helm/v4" {print $3}' "$here/helm/go.mod")
  echo "building helm $helm_version"
  (cd "$here/helm" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
  printf 'helm=%s\n' "$helm_version" > "$tmp/VERSIONS"
fi
if [ "$set_name" = keda ]; then
  # KEDA's go.mod carries replace directives, so `go install module@version` refuses:
  # download the module, copy it out of the read-only module cache and build in it.
  keda_version=$(tr -d '[:space:]' < "$here/keda/VERSION")
  keda_module=github.com/kedacore/keda/v2
  export GOCACHE="$(dirname "$dest")/gocache"
  mkdir -p "$GOCACHE"
  echo "downloading $keda_module@$keda_version (GOCACHE=$GOCACHE)"
  module_dir=$(go mod download -json "$keda_module@$keda_version" | awk -F'"' '$2=="Dir" {print $4}')
  [ -d "$module_dir" ] || { echo "build.sh: go mod download gave no directory" >&2; exit 4; }
  cp -r "$module_dir" "$tmp/src"
  chmod -R u+w "$tmp/src"
  keda_ldflags="-s -w -X $keda_module/version.Version=${keda_version#v} -X $keda_module/version.GitCommit=module-proxy"
  for cmd in operator adapter; do
    echo "building keda-$cmd $keda_version"
    (cd "$tmp/src" && go build -trimpath -ldflags "$keda_ldflags" -o "$tmp/keda-$cmd" "./cmd/$cmd")
  done
  # The CRDs (KEDA's config/crd) go with the binaries; the sources do not.
  mkdir -p "$tmp/crd"
  cp "$tmp"/src/config/crd/bases/*.yaml "$tmp/crd/"
  rm -rf "$tmp/src"
  printf 'keda=%s\n' "$keda_version" > "$tmp/VERSIONS"
fi
if [ "$set_name" = controlplane ]; then
  echo "building etcd $etcd_version"
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
fi
for cmd in $k8s_cmds; do
  echo "building $cmd $k8s_version"
  (cd "$here/kubernetes" && go build -trimpath -ldflags "$ldflags" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd")
done
if [ "$set_name" = node ]; then
  echo "building pause"
  (cd "$here/pause" && go build -trimpath -ldflags "-s -w" -o "$tmp/pause" .)
  printf 'kubernetes=%s\n' "$k8s_version" > "$tmp/VERSIONS"
elif [ "$set_name" = controlplane ]; then
  printf 'kubernetes=%s\netcd=%s\n' "$k8s_version" "$etcd_version" > "$tmp/VERSIONS"
fi
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "built into $dest"
