"""Checks run inside an agent pod's containers (``kubectl exec ... python3 -c``), with
what they are expected to print: used by the e2e scenario on real pods, and run
against a local sidecar process by the integration tests, so a script that is wrong
fails there before it reaches a node.

- ``SIDECAR_CALLS``: calls to a sidecar's agent API and metrics port (argv: API URL,
  metrics URL; the secret from ``$AGENTQ_SIDECAR_TOKEN_FILE``) without the secret,
  with a wrong one, with it, under a rebinding Host, as a form post.
- ``TASK_READS``, ``CLAIM_READ``: another team's AgentTasks read from the API server
  with a container's token (or none), and the operator's claim API asked for a claim,
  over TLS or not (e2e/test_tenancy.py); ``FETCH``, ``metric()``: a pod's metrics.
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


TASK_READS = r"""
import json, os, ssl, sys, urllib.error, urllib.request
token_file, ca_file, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
env = os.environ
base = "https://%s:%s" % (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
headers = {}
try:
    headers["Authorization"] = "Bearer " + open(token_file).read().strip()
except OSError:
    pass
tls = ssl.create_default_context(cafile=ca_file) if os.path.exists(ca_file) else (
    ssl._create_unverified_context())
out = {"a token": "Authorization" in headers}
for target in targets:
    namespace, name = target.split("/", 1)
    path = "/apis/agentq.dev/v1alpha1/namespaces/%s/agenttasks/%s" % (namespace, name)
    request = urllib.request.Request(base + path.rstrip("/"), headers=headers)
    try:
        with urllib.request.urlopen(request, context=tls, timeout=10) as response:
            out[target] = [response.status, response.read()[:2000].decode("utf-8", "replace")]
    except urllib.error.HTTPError as err:
        body = err.read()[:2000].decode("utf-8", "replace")
        try:
            body = json.loads(body).get("message", body)
        except ValueError:
            pass
        out[target] = [err.code, body]
    except OSError as err:
        out[target] = [0, repr(err)]
print(json.dumps(out))
"""
"""What the API server answers to ``get`` (``<namespace>/<task>``) and ``list``
(``<namespace>/``) of AgentTasks with the token in argv[1] (none if it cannot be read)
and the CA in argv[2] (not verified if absent); ``"a token"``: whether one was sent."""


def judge_task_reads(out: dict[str, Any], secret: str) -> list[str]:
    """TASK_READS of another team's tasks: every read refused -- 401 (no credential the
    API server takes) or 403 -- and ``secret`` (a payload of theirs) in no answer."""
    problems = []
    for target, answer in out.items():
        if target == "a token":
            continue
        status, message = answer
        if status not in (401, 403):
            problems.append(f"{target}: {status} {str(message)[:200]!r}")
        if secret in str(message):
            problems.append(f"{target}: the answer holds the team's payload")
    return problems


CLAIM_READ = r"""
import http.client, json, ssl, sys, urllib.parse
url, token_file, namespace, name = sys.argv[1:5]
ca, server_name = (sys.argv[5:] + ["", ""])[:2]
headers = {}
try:
    headers["Authorization"] = "Bearer " + open(token_file).read().strip()
except OSError:
    pass
target = urllib.parse.urlsplit(url)
if target.scheme == "https":
    if ca:
        context = ssl.create_default_context(cafile=ca)
    else:  # no CA bundle here: asks without checking whom it talks to
        context = ssl._create_unverified_context()

    class Connection(http.client.HTTPSConnection):
        def connect(self):
            http.client.HTTPConnection.connect(self)
            host = server_name or target.hostname
            self.sock = context.wrap_socket(self.sock, server_hostname=host)

    connection = Connection(target.hostname, target.port, timeout=10)
else:
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
try:
    connection.request("GET", "/v1/claims/%s/%s" % (namespace, name), headers=headers)
    response = connection.getresponse()
    body = response.read().decode("utf-8", "replace")
    try:
        body = json.loads(body)
    except ValueError:
        pass
    if response.status != 200 and isinstance(body, dict):
        body = body.get("message", body)
    print(json.dumps([response.status, body]))
except (OSError, http.client.HTTPException) as err:  # no HTTP answer
    print(json.dumps([0, repr(err)]))
"""
"""The operator's claim API (argv: its URL, a token file -- none sent if it cannot be
read --, the claim Lease's namespace and name; for an https URL, the CA bundle to
verify the operator's certificate with -- empty: not verified -- and the name it must
carry, when not the URL's host): ``[status, body or message]``, status 0 when no HTTP
answer came (a refused handshake, a closed connection)."""

FETCH = r"""
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as response:
        print(json.dumps([response.status, response.read().decode("utf-8", "replace")]))
except OSError as err:
    print(json.dumps([0, repr(err)]))
"""
"""A plain GET of argv's URL (a pod's own metrics): ``[status, body]``."""


def metric(text: str, name: str, **labels: str) -> list[float]:
    """The values of the samples named ``name`` whose labels include ``labels``, in
    the Prometheus text exposition ``text``."""
    values = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sample, _, value = line.rpartition(" ")
        metric_name, _, label_text = sample.partition("{")
        if metric_name == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            values.append(float(value))
    return values
