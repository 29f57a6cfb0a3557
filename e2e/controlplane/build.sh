#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from the
# Go module proxy with the machine's Go toolchain, into DEST (one directory
# per Kubernetes version, so the build happens once per machine).
#
# usage: build.sh DEST
# The versions are the ones pinned in ./kubernetes/go.mod and ./etcd/go.mod.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: build.sh DEST}
command -v go >/dev/null || { echo "build.sh: 'go' is not on PATH; install Go >= 1.26" >&2; exit 3; }

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
echo "building etcd $etcd_version"
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
for cmd in kube-apiserver kube-controller-manager kubectl; do
  echo "building $cmd $k8s_version"
  (cd "$here/kubernetes" && go build -trimpath -ldflags "$ldflags" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd")
done
printf 'kubernetes=%s\netcd=%s\n' "$k8s_version" "$etcd_version" > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "built into $dest"
