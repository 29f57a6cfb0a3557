#!/usr/bin/env bash
# The e2e scenario (e2e/test_scenario.py: the same scenario `make e2e` runs on the
# local node, there on the Helm chart's install, here on the kustomize base) on a
# kind cluster, for machines with a Docker engine and kind. kind runs
# its nodes as privileged containers, which some machines (this project's CI, for
# one) cannot start: there `make e2e` is the way.
#
# usage: e2e/kind/run.sh   (creates cluster "agentq-e2e" and deletes it at the end;
#                           KIND_NODE_IMAGE picks the node image, Kubernetes >= 1.30)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v docker >/dev/null && docker info >/dev/null 2>&1 || { echo "needs a Docker engine" >&2; exit 3; }
command -v kind >/dev/null || { echo "needs kind on PATH" >&2; exit 3; }
cluster=agentq-e2e
kubeconfig=$(mktemp)
make venv controlplane
kubectl=$(.venv/bin/agentq cluster build 2>/dev/null | awk '$1 == "kubectl" {print $2}')
kind create cluster --name "$cluster" --kubeconfig "$kubeconfig" --wait 180s \
  ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
trap 'kind delete cluster --name "$cluster"; rm -f "$kubeconfig"' EXIT
docker build -t agentq:dev .
kind load docker-image agentq:dev --name "$cluster"
AGENTQ_E2E_KUBECONFIG="$kubeconfig" \
AGENTQ_E2E_KUBECTL="$kubectl" \
AGENTQ_E2E_CTR="docker exec $cluster-control-plane ctr" \
AGENTQ_E2E_IMAGE=agentq:dev \
  .venv/bin/pytest -s -p no:cacheprovider e2e/test_scenario.py
