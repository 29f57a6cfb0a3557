"""The Kubernetes client for operator, sidecar and CLI, chosen by measurement.

For each candidate client, in one run against one real API server (the embedded
control plane) and each in its own fresh process:

- import: wall seconds, CPU seconds and RSS after importing the client alone
  (for agentq: ``agentq.kube``; median of ``--imports`` fresh processes);
- the operator's hot calls, ``--requests`` of each, 16 in flight: an AgentTask
  status merge patch with a resourceVersion CAS, a Lease create, a Lease replace
  (CAS) and a Lease GET; client CPU seconds (user + system, the whole process) per
  request and requests per second (the API server's time is the same for all).

Candidates: ``agentq`` (this tree's port: ``agentq.operator.rest.RestKube``),
``baseline=DIR`` (the same from another source tree, e.g. ``git archive main``),
``kubernetes_asyncio``, ``lightkube``, ``kr8s``, and ``kubernetes`` (the sync
client in threads, as ``ThreadedKube`` used it). Each is used the cheapest way a
port would use it: raw JSON where the library allows it (kubernetes_asyncio with
``_preload_content=False``, kr8s's ``call_api``), its models where it does not
(lightkube). The candidates other than ``agentq`` are not dependencies of agentq:
install them in a separate virtualenv and pass its interpreter with ``--python``
(see docs/benchmarks.md for the versions).

usage: python bench/client_bench.py [--python PY] [--candidates a,b] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION_START = "<!-- BEGIN client benchmark (bench/client_bench.py) -->"
SECTION_END = "<!-- END client benchmark -->"
GROUP, VERSION, PLURAL = "agentq.dev", "v1alpha1", "agenttasks"
CONCURRENCY = 16
CALLS = ("status CAS", "Lease create", "Lease replace", "Lease GET")
ALL = "agentq,kubernetes_asyncio,lightkube,kr8s,kubernetes"


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def lease_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "labels": {"agentq.dev/lease": "task"}},
        "spec": {"holderIdentity": "bench", "leaseDurationSeconds": 30},
    }


def status_patch(rv: str, i: int) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}, "status": {"phase": "Pending", "attempt": i}}


# -- the candidates: each a small port with the four calls ----------------------------


class Port:
    """The four hot calls; bodies are JSON dicts; each returns the answer's body."""

    async def patch_status(self, ns: str, name: str, rv: str, i: int) -> Any: ...
    async def create_lease(self, ns: str, body: dict[str, Any]) -> Any: ...
    async def replace_lease(self, ns: str, name: str, body: dict[str, Any]) -> Any: ...
    async def get_lease(self, ns: str, name: str) -> Any: ...
    async def close(self) -> None: ...


def import_candidate(name: str) -> None:
    """What a port on ``name`` imports (measured: time, CPU, RSS)."""
    if name == "agentq":  # the client alone (the operator's port adds agentq's own models)
        import agentq.kube
    elif name == "baseline":  # its client: connection.py on aiohttp
        import agentq.operator.connection  # noqa: F401
        import aiohttp  # noqa: F401
    elif name == "kubernetes_asyncio":
        import kubernetes_asyncio.client
        import kubernetes_asyncio.config  # noqa: F401
    elif name == "lightkube":
        import lightkube
        import lightkube.generic_resource
        import lightkube.resources.coordination_v1  # noqa: F401
    elif name == "kr8s":
        import kr8s.asyncio  # noqa: F401
    elif name == "kubernetes":
        import kubernetes.client
        import kubernetes.config  # noqa: F401
    elif name != "none":
        raise SystemExit(f"unknown candidate {name!r}")


async def make_port(name: str, kubeconfig: str) -> Port:
    if name in ("agentq", "baseline"):
        return await _agentq(kubeconfig)
    if name == "kubernetes_asyncio":
        return await _kubernetes_asyncio(kubeconfig)
    if name == "lightkube":
        return _lightkube(kubeconfig)
    if name == "kr8s":
        return await _kr8s(kubeconfig)
    if name == "kubernetes":
        return _kubernetes(kubeconfig)
    raise SystemExit(f"unknown candidate {name!r}")


async def _agentq(kubeconfig: str) -> Port:
    from agentq.operator import rest

    try:  # this tree: one client for all (agentq.kube)
        from agentq import kube

        kube_port: Any = rest.RestKube(kube.Client(kube.load(kubeconfig)))
    except ImportError:  # a tree from before agentq.kube
        from agentq.operator import connection

        kube_port = rest.RestKube(connection.from_kubeconfig(kubeconfig))

    class AgentqPort(Port):
        async def patch_status(self, ns: str, name: str, rv: str, i: int) -> Any:
            patch = status_patch(rv, i)
            return await kube_port.patch_status(PLURAL, ns, name, rv, patch["status"])

        async def create_lease(self, ns: str, body: dict[str, Any]) -> Any:
            return (await kube_port.create_lease(ns, body)).body

        async def replace_lease(self, ns: str, name: str, body: dict[str, Any]) -> Any:
            return (await kube_port.replace_lease(ns, name, body)).body

        async def get_lease(self, ns: str, name: str) -> Any:
            return (await kube_port.get_lease(ns, name)).body

        async def close(self) -> None:
            await kube_port.close()

    return AgentqPort()


async def _kubernetes_asyncio(kubeconfig: str) -> Port:
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = CONCURRENCY + 4
    api = client.ApiClient(configuration)
    custom = client.CustomObjectsApi(api)
    leases = client.CoordinationV1Api(api)

    async def raw(coro: Any) -> Any:
        rsp = await coro
        return json.loads(await rsp.read())

    class KubernetesAsyncioPort(Port):
        async def patch_status(self, ns: str, name: str, rv: str, i: int) -> Any:
            return await raw(
                custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ns, PLURAL, name, status_patch(rv, i),
                    _content_type="application/merge-patch+json", _preload_content=False,
                )
            )  # fmt: skip

        async def create_lease(self, ns: str, body: dict[str, Any]) -> Any:
            return await raw(leases.create_namespaced_lease(ns, body, _preload_content=False))

        async def replace_lease(self, ns: str, name: str, body: dict[str, Any]) -> Any:
            return await raw(
                leases.replace_namespaced_lease(name, ns, body, _preload_content=False)
            )

        async def get_lease(self, ns: str, name: str) -> Any:
            return await raw(leases.read_namespaced_lease(name, ns, _preload_content=False))

        async def close(self) -> None:
            await api.close()

    return KubernetesAsyncioPort()


def _lightkube(kubeconfig: str) -> Port:
    from lightkube import AsyncClient, KubeConfig
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.coordination_v1 import Lease
    from lightkube.types import PatchType

    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    task = create_namespaced_resource(GROUP, VERSION, "AgentTask", PLURAL)

    class LightkubePort(Port):
        async def patch_status(self, ns: str, name: str, rv: str, i: int) -> Any:
            return await client.patch(
                task.Status, name, status_patch(rv, i), namespace=ns, patch_type=PatchType.MERGE
            )

        async def create_lease(self, ns: str, body: dict[str, Any]) -> Any:
            return (await client.create(Lease.from_dict(body), namespace=ns)).to_dict()

        async def replace_lease(self, ns: str, name: str, body: dict[str, Any]) -> Any:
            return (await client.replace(Lease.from_dict(body), namespace=ns)).to_dict()

        async def get_lease(self, ns: str, name: str) -> Any:
            return (await client.get(Lease, name, namespace=ns)).to_dict()

        async def close(self) -> None:
            await client.close()

    return LightkubePort()


async def _kr8s(kubeconfig: str) -> Port:
    import kr8s.asyncio

    api = await kr8s.asyncio.api(kubeconfig=kubeconfig)
    merge = {"Content-Type": "application/merge-patch+json"}

    async def call(
        method: str, version: str, url: str, ns: str, body: Any = None, **kw: Any
    ) -> Any:
        content = json.dumps(body) if body is not None else None
        async with api.call_api(
            method, version=version, url=url, namespace=ns, content=content, **kw
        ) as rsp:
            return rsp.json()

    class Kr8sPort(Port):
        async def patch_status(self, ns: str, name: str, rv: str, i: int) -> Any:
            url = f"{PLURAL}/{name}/status"
            return await call(
                "PATCH", f"{GROUP}/{VERSION}", url, ns, status_patch(rv, i), headers=merge
            )

        async def create_lease(self, ns: str, body: dict[str, Any]) -> Any:
            return await call("POST", "coordination.k8s.io/v1", "leases", ns, body)

        async def replace_lease(self, ns: str, name: str, body: dict[str, Any]) -> Any:
            return await call("PUT", "coordination.k8s.io/v1", f"leases/{name}", ns, body)

        async def get_lease(self, ns: str, name: str) -> Any:
            return await call("GET", "coordination.k8s.io/v1", f"leases/{name}", ns)

        async def close(self) -> None:
            if api._session is not None:
                await api._session.aclose()

    return Kr8sPort()


def _kubernetes(kubeconfig: str) -> Port:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = CONCURRENCY + 4
    api = client.ApiClient(configuration)
    custom = client.CustomObjectsApi(api)
    leases = client.CoordinationV1Api(api)

    def raw(rsp: Any) -> Any:
        return json.loads(rsp.data)

    class KubernetesPort(Port):
        async def patch_status(self, ns: str, name: str, rv: str, i: int) -> Any:
            return raw(
                await asyncio.to_thread(
                    custom.patch_namespaced_custom_object_status,
                    GROUP, VERSION, ns, PLURAL, name, status_patch(rv, i),
                    _content_type="application/merge-patch+json", _preload_content=False,
                )
            )  # fmt: skip

        async def create_lease(self, ns: str, body: dict[str, Any]) -> Any:
            return raw(
                await asyncio.to_thread(
                    leases.create_namespaced_lease, ns, body, _preload_content=False
                )
            )

        async def replace_lease(self, ns: str, name: str, body: dict[str, Any]) -> Any:
            return raw(
                await asyncio.to_thread(
                    leases.replace_namespaced_lease, name, ns, body, _preload_content=False
                )
            )

        async def get_lease(self, ns: str, name: str) -> Any:
            return raw(
                await asyncio.to_thread(
                    leases.read_namespaced_lease, name, ns, _preload_content=False
                )
            )

        async def close(self) -> None:
            api.close()

    return KubernetesPort()


# -- a child process: one candidate ---------------------------------------------------


def child_import(name: str) -> dict[str, float]:
    rss0, cpu0, t0 = rss_kib(), time.process_time(), time.perf_counter()
    import_candidate(name)
    return {
        "import_s": time.perf_counter() - t0,
        "import_cpu_s": time.process_time() - cpu0,
        "import_rss_kib": rss_kib() - rss0,
        "rss_after_kib": rss_kib(),
    }


async def child_calls(name: str, kubeconfig: str, plan: dict[str, Any]) -> dict[str, Any]:
    import_candidate(name)
    port = await make_port(name, kubeconfig)
    ns, tasks, count = plan["namespace"], plan["tasks"], plan["count"]
    sem = asyncio.Semaphore(CONCURRENCY)
    out: dict[str, Any] = {}

    async def timed(label: str, jobs: list[Any]) -> list[Any]:
        async def one(job: Any) -> Any:
            async with sem:
                return await job()

        cpu0, t0 = time.process_time(), time.perf_counter()
        results = await asyncio.gather(*(one(j) for j in jobs))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        out[label] = {"cpu_ms": 1000 * cpu / len(jobs), "per_s": len(jobs) / wall}
        return results

    try:
        # warm-up outside the timing: the pool's connections (TLS), lazy imports
        await asyncio.gather(*(port.get_lease(ns, "warm") for _ in range(CONCURRENCY)))
        names = [f"lease-{i}" for i in range(count)]
        await timed(
            "status CAS",
            [
                lambda t=t, i=i: port.patch_status(ns, t["name"], t["rv"], i)
                for i, t in enumerate(tasks[:count])
            ],
        )
        created = await timed(
            "Lease create", [lambda n=n: port.create_lease(ns, lease_body(n)) for n in names]
        )
        for body in created:
            assert isinstance(body, dict) and body.get("metadata", {}).get("resourceVersion"), body
        await timed(
            "Lease replace",
            [
                lambda b=b: port.replace_lease(
                    ns,
                    b["metadata"]["name"],
                    {
                        **lease_body(b["metadata"]["name"]),
                        "metadata": {
                            "name": b["metadata"]["name"],
                            "resourceVersion": b["metadata"]["resourceVersion"],
                        },
                    },
                )
                for b in created
            ],
        )
        await timed("Lease GET", [lambda n=n: port.get_lease(ns, n) for n in names])
    finally:
        await port.close()
    out["rss_after_calls_kib"] = rss_kib()
    return out


# -- the driver ----------------------------------------------------------------------


def run_child(python: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [python, str(Path(__file__).resolve()), "--child", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def prepare(kubeconfig: str, namespace: str, count: int) -> list[dict[str, str]]:
    """A namespace with ``count`` AgentTasks; their names and resourceVersions."""
    sys.path.insert(0, str(ROOT / "bench"))
    from load_common import Api, bounded, connect

    api = Api(connect(kubeconfig))
    try:
        await api.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        await api.request("POST", leases, lease_body("warm"))

        async def task(i: int) -> dict[str, str]:
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AgentTask",
                "metadata": {"name": f"t-{i}"},
                "spec": {"requiredCapabilities": ["x"], "payload": {"i": i}},
            }
            status, created = await api.request("POST", path, body)
            assert status == 201, created
            return {
                "name": created["metadata"]["name"],
                "rv": created["metadata"]["resourceVersion"],
            }

        return await bounded([lambda i=i: task(i) for i in range(count)], 32)
    finally:
        await api.close()


def child_env(candidate: str) -> tuple[str, dict[str, str]]:
    env = {**os.environ}
    name = candidate
    if candidate.startswith("baseline="):
        env["PYTHONPATH"] = str(Path(candidate.split("=", 1)[1]) / "operator")
        name = "baseline"
    else:
        env["PYTHONPATH"] = str(ROOT / "operator")
    return name, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--python", default=sys.executable, help="interpreter with candidates")
    parser.add_argument("--candidates", default=ALL, help=f"comma list [default: {ALL}]")
    parser.add_argument("--requests", type=int, default=500, help="of each call")
    parser.add_argument("--imports", type=int, default=5, help="fresh processes per import")
    parser.add_argument("--rounds", type=int, default=2, help="of the calls, interleaved")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.child:
        name, *rest = args.child
        if rest[0] == "import":
            print(json.dumps(child_import(name)))
        else:
            plan = json.loads(Path(rest[2]).read_text())
            print(json.dumps(asyncio.run(child_calls(name, rest[1], plan))))
        return

    from agentq.controlplane.cluster import Cluster

    started = time.monotonic()
    candidates = [c for c in args.candidates.split(",") if c]
    workdir = Path(tempfile.mkdtemp(prefix="agentq-bench-client-"))
    cluster = Cluster(workdir / "cluster")
    state = cluster.up(build=True, tie_to_parent=True)
    results: dict[str, dict[str, Any]] = {c: {} for c in candidates}
    try:
        subprocess.run(
            [state.binaries["kubectl"], "apply", "-f", str(ROOT / "crds")],
            env={**os.environ, "KUBECONFIG": state.kubeconfig},
            check=True,
            capture_output=True,
        )
        time.sleep(2)  # the CRDs established
        imports: dict[str, list[dict[str, float]]] = {c: [] for c in ["none", *candidates]}
        for _ in range(args.imports):  # interleaved: the machine's load moves
            for candidate in imports:
                name, env = child_env(candidate)
                imports[candidate].append(run_child(args.python, env, name, "import"))
        for round_ in range(args.rounds):
            for candidate in candidates:
                name, env = child_env(candidate)
                ns = f"bench-{name.replace('_', '-')}-{round_}"
                tasks = asyncio.run(prepare(state.kubeconfig, ns, args.requests))
                plan = workdir / f"{ns}.json"
                plan.write_text(
                    json.dumps({"namespace": ns, "tasks": tasks, "count": args.requests})
                )
                got = run_child(args.python, env, name, "calls", state.kubeconfig, str(plan))
                print(candidate, json.dumps(got), flush=True)
                for call in CALLS:  # the best round of each call
                    best = results[candidate].get(call)
                    if best is None or got[call]["cpu_ms"] < best["cpu_ms"]:
                        results[candidate][call] = got[call]
                results[candidate]["rss_after_calls_kib"] = got["rss_after_calls_kib"]
        for candidate in ["none", *candidates]:
            runs = imports[candidate]
            summary = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            results.setdefault(candidate, {})["import"] = summary
    finally:
        cluster.down()
        shutil.rmtree(workdir, ignore_errors=True)
    section = render(results, candidates, args, time.monotonic() - started)
    print(section)
    if args.write_docs:
        sys.path.insert(0, str(ROOT / "bench"))
        import docsection

        docsection.write_section(DOCS, SECTION_START, SECTION_END, section)


def version_of(python: str, candidate: str) -> str:
    dist = {"kubernetes_asyncio": "kubernetes_asyncio", "lightkube": "lightkube", "kr8s": "kr8s",
            "kubernetes": "kubernetes", "agentq": "aiohttp"}.get(candidate)  # fmt: skip
    if dist is None:
        return "-"
    out = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    version = out.stdout.strip() or "?"
    return f"aiohttp {version}" if candidate == "agentq" else version


def render(
    results: dict[str, dict[str, Any]], candidates: list[str], args: Any, took: float
) -> str:
    ref = results[candidates[0]]
    none = results["none"]["import"]
    lines = [
        SECTION_START,
        "## One Kubernetes client for operator, sidecar and CLI",
        "",
        "Each candidate in its own fresh process against the same API server, in one run.",
        f"Import: median of {args.imports} processes (`none`: the interpreter with asyncio and",
        "json only). Calls: the operator's hot requests, "
        f"{args.requests} of each, {CONCURRENCY} in flight, the best of {args.rounds} "
        "interleaved rounds; client CPU (user + system) per request. Ratios against "
        f"`{candidates[0]}`.",
        "",
        "| client | version | import s | import CPU s | RSS after import MiB | "
        + " | ".join(f"{c}: CPU ms" for c in CALLS)
        + " | CPU vs first | requests/s (status CAS / Lease create) |",
        "|---|---|--:|--:|--:|" + "--:|" * len(CALLS) + "--:|--:|",
        f"| none (interpreter) | - | {none['import_s']:.3f} | {none['import_cpu_s']:.3f} | "
        f"{none['rss_after_kib'] / 1024:.1f} |" + " - |" * len(CALLS) + " - | - |",
    ]
    ref_cpu = sum(ref[c]["cpu_ms"] for c in CALLS)
    for candidate in candidates:
        r = results[candidate]
        imp = r["import"]
        cpu = sum(r[c]["cpu_ms"] for c in CALLS)
        lines.append(
            f"| {candidate.split('=')[0]} | {version_of(args.python, candidate)} | "
            f"{imp['import_s']:.3f} | {imp['import_cpu_s']:.3f} | "
            f"{imp['rss_after_kib'] / 1024:.1f} | "
            + " | ".join(f"{r[c]['cpu_ms']:.3f}" for c in CALLS)
            + f" | {cpu / ref_cpu:.2f}x | "
            f"{r['status CAS']['per_s']:,.0f} / {r['Lease create']['per_s']:,.0f} |"
        )
    load = os.getloadavg()
    lines += [
        "",
        "Measured with:",
        "",
        "```",
        f"python bench/client_bench.py --python PY --candidates {args.candidates}"
        + (" --write-docs" if args.write_docs else ""),
        "```",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}",
        f"- load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} "
        "(a shared machine: compare rows of one run)",
        f"- whole benchmark: {took:.0f} s",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
