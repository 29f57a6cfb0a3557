"""``agentq operator`` with the comparison writer: the kubernetes sync client in threads.

The ``threads`` variant of bench/load_bench.py runs this instead of ``agentq
operator`` (same arguments): the production CLI has no such mode. It swaps the
operator's port factory (``agentq.operator.main.make_kube``) for
``threaded_kube.ThreadedKube`` and runs the ordinary command.

usage: python bench/threaded_operator.py operator [agentq operator flags]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from threaded_kube import ThreadedKube, make_api_client

from agentq import kube
from agentq.cli import main
from agentq.operator import main as operator_main
from agentq.operator.config import OperatorConfig
from agentq.operator.port import Kube


def make_kube(config: OperatorConfig, kubeconfig: kube.KubeConfig) -> Kube:
    return ThreadedKube(
        make_api_client(pool_size=config.write_concurrency + 4),
        request_timeout=config.request_seconds,
    )


if __name__ == "__main__":
    operator_main.make_kube = make_kube
    main()
