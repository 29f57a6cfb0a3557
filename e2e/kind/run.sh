#!/usr/bin/env bash
# The demo scenario on kind, with the Dockerfile's image, for machines with Docker.
# (The development machines have no Docker engine; there `make demo` runs the same
# job on the embedded control plane.)
#
# usage: e2e/kind/run.sh   — creates cluster "agentq-e2e", deletes it at the end
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v docker >/dev/null && docker info >/dev/null 2>&1 || { echo "needs a Docker engine" >&2; exit 3; }
command -v kind >/dev/null || { echo "needs kind on PATH" >&2; exit 3; }
cluster=agentq-e2e
kind create cluster --name "$cluster" --wait 120s
trap 'kind delete cluster --name "$cluster"' EXIT
docker build -t agentq:dev .
kind load docker-image agentq:dev --name "$cluster"

kubectl apply -f crds/
kubectl wait --for=condition=Established crd/agenttasks.agentq.dev crd/agentworkers.agentq.dev
kubectl apply -f manifests/namespace.yaml -f manifests/rbac.yaml -f manifests/operator.yaml
kubectl -n agentq-system rollout status deploy/agentq-operator --timeout=180s
kubectl create namespace agentq-e2e
kubectl apply -f e2e/kind/agents.yaml
for i in $(seq -w 1 30); do
  cat <<YAML
---
apiVersion: agentq.dev/v1alpha1
kind: AgentTask
metadata: {name: task-$i, namespace: agentq-e2e}
spec: {requiredCapabilities: [llm], cost: $(( (10#$i % 3) + 1 )), leaseDurationSeconds: 6}
YAML
done | kubectl apply -f -

# A lost lease: kill the large agent's pod without grace mid-run.
sleep 5
kubectl -n agentq-e2e delete pod -l agent=large --grace-period=0 --force
for _ in $(seq 1 120); do
  left=$(kubectl -n agentq-e2e get agenttasks -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -vc '^Succeeded$' || true)
  [ "$left" = 0 ] && break
  sleep 2
done
kubectl -n agentq-e2e get agenttasks
[ "$left" = 0 ] || { echo "FAIL: $left tasks not Succeeded" >&2; exit 1; }
echo "PASS: all 30 tasks Succeeded, reclaims: $(kubectl -n agentq-e2e get agenttasks -o jsonpath='{.items[*].status.reclaims}')"
