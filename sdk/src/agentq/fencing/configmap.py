"""The Kubernetes ConfigMap backend: one ConfigMap holds the records, each entry its
own token; every change is a compare-and-swap on the ConfigMap's resourceVersion.

A write reads the ConfigMap, checks the token of the key's entry, and replaces
the ConfigMap with the resourceVersion it read: if anyone changed it in
between, the API server answers 409 and the write starts again from a fresh
read, so the check and the raise of the token are atomic. Writers of different
keys contend on the same object (and retry); a ConfigMap holds at most 1 MiB,
so this backend is for small results and references, not bulk data.

Synchronous (the kubernetes client), like the agents that call it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from typing import Any

from agentq.fencing.base import (
    UNSET,
    FencedStore,
    Record,
    StaleTokenError,
    check_key,
    check_token,
    needs_extra,
)

with needs_extra("configmap", "the ConfigMap store"):
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

_DATA_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")


def data_key(key: str) -> str:
    """The ConfigMap data key of ``key`` (ConfigMap keys allow only ``[-._a-zA-Z0-9]``)."""
    if _DATA_KEY.fullmatch(key) and not key.startswith("sha256."):
        return key
    return "sha256." + hashlib.sha256(key.encode()).hexdigest()


def _api_client(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class ConfigMapFencedStore(FencedStore):
    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        api_client: client.ApiClient | None = None,
        kubeconfig: str | None = None,
        max_conflicts: int = 100,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self._own_client = api_client is None
        self._api = api_client or _api_client(kubeconfig)
        self.core = client.CoreV1Api(self._api)
        self.max_conflicts = max_conflicts
        self.conflicts = 0  # 409s seen (each one a retry), for tests and curiosity

    def _read(self) -> Any:
        try:
            return self.core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def _entry(self, configmap: Any, key: str) -> Record | None:
        raw = ((configmap.data or {}) if configmap is not None else {}).get(data_key(key))
        if raw is None:
            return None
        entry = json.loads(raw)
        if entry.get("key") != key:
            raise RuntimeError(f"ConfigMap entry {data_key(key)} belongs to {entry.get('key')!r}")
        return Record(key, int(entry["token"]), entry.get("value"), int(entry["revision"]))

    def _change(self, key: str, token: int, value: Any) -> Record:
        check_key(key)
        check_token(token)
        self._refuse_owed(key, token)
        rand = random.Random()
        for _ in range(self.max_conflicts):
            configmap = self._read()
            previous = self._entry(configmap, key)
            if previous is not None and token < previous.token:
                raise StaleTokenError(key, token, previous.token)
            stored = (previous.value if previous else None) if value is UNSET else value
            record = Record(key, token, stored, (previous.revision if previous else 0) + 1)
            text = json.dumps(
                {"key": key, "token": token, "revision": record.revision, "value": stored},
                separators=(",", ":"),
            )
            try:
                if configmap is None:
                    body = client.V1ConfigMap(
                        metadata=client.V1ObjectMeta(
                            name=self.name,
                            namespace=self.namespace,
                            labels={"agentq.dev/fenced-store": "true"},
                        ),
                        data={data_key(key): text},
                    )
                    self.core.create_namespaced_config_map(self.namespace, body)
                else:
                    configmap.data = {**(configmap.data or {}), data_key(key): text}
                    # The resourceVersion read above travels with the object: a CAS.
                    self.core.replace_namespaced_config_map(self.name, self.namespace, configmap)
                return record
            except ApiException as err:
                if err.status != 409:
                    raise
                self.conflicts += 1
                time.sleep(rand.uniform(0, 0.02))
        raise RuntimeError(
            f"ConfigMap {self.namespace}/{self.name}: {self.max_conflicts} conflicts in a row "
            f"writing {key!r}; too many writers of one ConfigMap"
        )

    def write(self, key: str, token: int, value: Any) -> Record:
        json.dumps(value)
        return self._change(key, token, value)

    def fence(self, key: str, token: int) -> Record:
        return self._change(key, token, UNSET)

    def read(self, key: str) -> Record | None:
        return self._entry(self._read(), key)

    def records(self) -> list[Record]:
        configmap = self._read()
        out = []
        for raw in ((configmap.data or {}) if configmap is not None else {}).values():
            entry = json.loads(raw)
            out.append(
                Record(
                    str(entry["key"]),
                    int(entry["token"]),
                    entry.get("value"),
                    int(entry["revision"]),
                )
            )
        return sorted(out, key=lambda r: r.key)

    def ref(self, key: str) -> str:
        return f"configmap://{self.namespace}/{self.name}#{data_key(key)}"

    def close(self) -> None:
        if self._own_client:
            self._api.close()
