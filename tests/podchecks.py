"""Checks run inside an agent pod's containers (``kubectl exec ... python3 -c``), with
what they are expected to print: used by the e2e scenario on real pods, and run
against a local sidecar process by the integration tests, so a script that is wrong
fails there before it reaches a node.

- ``SIDECAR_CALLS``: calls to a sidecar's agent API and metrics port (argv: API URL,
  metrics URL; the secret from ``$AGENTQ_SIDECAR_TOKEN_FILE``) without the secret,
  with a wrong one, with it, under a rebinding Host, as a form post.
- ``NO_CREDENTIALS``: what Kubernetes credentials the container has (argv: the
  namespace): a mounted token, $KUBECONFIG, ~/.kube/config, and what the API server
  says to a call without any; whether the volume shared with the sidecar is writable.
"""

from __future__ import annotations

from typing import Any

SIDECAR_CALLS = r"""
import json, os, sys, urllib.error, urllib.request
api, metrics = sys.argv[1], sys.argv[2]
path = os.environ.get("AGENTQ_SIDECAR_TOKEN_FILE", "/run/agentq/sidecar-token")
try:
    secret = open(path).read().strip()
except OSError as err:
    secret = "unreadable-" + type(err).__name__

def call(base, path, headers=None, data=None, method=None):
    req = urllib.request.Request(base + path, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return [response.status, ""]
    except urllib.error.HTTPError as err:
        try:
            return [err.code, json.loads(err.read()).get("error", "")]
        except ValueError:
            return [err.code, ""]
    except OSError as err:
        return [0, type(getattr(err, "reason", err)).__name__]

good = {"Authorization": "Bearer " + secret}
print(json.dumps({
    "no secret": call(api, "/v1/assignments"),
    "a wrong secret": call(api, "/v1/assignments", {"Authorization": "Bearer " + "x" * 43}),
    "the secret": call(api, "/v1/assignments", good),
    "a rebinding Host": call(api, "/v1/status", dict(good, Host="attacker.example")),
    "a form post": call(api, "/v1/assignments/x/complete", good, b"token=1", "POST"),
    "metrics without a secret": call(metrics, "/metrics"),
    "the API on the metrics port": call(metrics, "/v1/assignments", good),
}))
"""

# What SIDECAR_CALLS prints from the agent container of the sidecar's own pod.
FROM_ITS_AGENT = {
    "no secret": [401, "Unauthorized"],
    "a wrong secret": [401, "Unauthorized"],
    "the secret": [200, ""],
    "a rebinding Host": [403, "HostNotAllowed"],
    "a form post": [415, "UnsupportedMediaType"],
    "metrics without a secret": [200, ""],
    "the API on the metrics port": [404, "NotFound"],
}


def judge_from_another_pod(out: dict[str, Any]) -> list[str]:
    """SIDECAR_CALLS from another pod, at the target pod's IP: the API (loopback only)
    cannot even be reached, with or without a secret; the metrics port can."""
    problems = []
    for what in ("no secret", "a wrong secret", "the secret", "a rebinding Host", "a form post"):
        status = out[what][0]
        if status != 0:
            problems.append(f"{what}: the agent API answered {out[what]} from another pod")
    if out["metrics without a secret"][0] != 200:
        problems.append(f"metrics: {out['metrics without a secret']}")
    if out["the API on the metrics port"][0] != 404:
        problems.append(f"the API on the metrics port: {out['the API on the metrics port']}")
    return problems


NO_CREDENTIALS = r"""
import json, os, ssl, sys, urllib.error, urllib.request
SA = "/var/run/secrets/kubernetes.io/serviceaccount"
namespace = sys.argv[1]
out = {
    "mounted token": os.path.exists(SA + "/token"),
    "KUBECONFIG": os.environ.get("KUBECONFIG"),
    "a kubeconfig in HOME": os.path.exists(os.path.expanduser("~/.kube/config")),
}
host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
url = "https://%s:%s/apis/coordination.k8s.io/v1/namespaces/%s/leases" % (host, port, namespace)
try:
    with urllib.request.urlopen(url, context=ssl._create_unverified_context(), timeout=10) as r:
        out["API server without credentials"] = [r.status, ""]
except urllib.error.HTTPError as err:
    out["API server without credentials"] = [err.code, err.read()[:300].decode("utf-8", "replace")]
except OSError as err:
    out["API server without credentials"] = [0, repr(err)]
shared = os.path.dirname(os.environ.get("AGENTQ_SIDECAR_TOKEN_FILE", "/run/agentq/x"))
try:
    with open(os.path.join(shared, "planted"), "w") as planted:
        planted.write("x")
    out["writes the shared volume"] = True
except OSError:
    out["writes the shared volume"] = False
print(json.dumps(out))
"""


def judge_no_credentials(out: dict[str, Any]) -> list[str]:
    """NO_CREDENTIALS from an agent container: no credential of any kind, the API server
    treats it as anonymous (401, or 403 for system:anonymous), the share is read-only."""
    problems = []
    for what in ("mounted token", "KUBECONFIG", "a kubeconfig in HOME", "writes the shared volume"):
        if out.get(what):
            problems.append(f"{what}: {out.get(what)!r}")
    status, message = out["API server without credentials"]
    if not (status == 401 or (status == 403 and "system:anonymous" in message)):
        problems.append(f"the API server answered {status} {message[:200]!r} without credentials")
    return problems
