"""A flood of the claim port does not stop the operator serving others (docs/security.md,
"The claim port"): a real operator process serving the claim API over TLS, flooded by
``tests/claim_flood.py`` (a new connection, so a new TLS handshake, and a new bogus
bearer token in every request, from 200 at a time) while tasks are dispatched to a
worker of its namespace.

Measured and printed (``pytest -s``): the time to dispatch and complete 20 tasks
without and with the flood, the event loop's lag (``agentq_loop_lag_seconds``,
sampled), the TokenReviews the API server received during the flood, and the flood's
answers by HTTP status. Asserted: dispatch goes on (the flooded batch completes
within a bound of the quiet one), and TokenReviews stay within the operator's budget
(``REVIEW_RATE`` a second, ``REVIEW_BURST`` at once); the refused are 429s.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from agentq.controlplane.cluster import free_port
from agentq.operator.claim_api import REVIEW_BURST, REVIEW_RATE
from builders import task, worker
from certs import SERVICE_NAME, Ca
from fleet import ControlPlane, Fleet

FLOOD = str(Path(__file__).parent.parent / "claim_flood.py")
FLOOD_SECONDS = 20.0


def token_reviews(control_plane: ControlPlane) -> float:
    """TokenReviews the API server has answered (apiserver_request_total)."""
    text = control_plane.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="tokenreviews"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class LagSampler(threading.Thread):
    """The operator's ``agentq_loop_lag_seconds``, every 0.2 s: the largest seen."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.worst = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as rsp:
                    text = rsp.read().decode()
            except OSError:
                continue
            match = re.search(r"^agentq_loop_lag_seconds (\S+)$", text, re.M)
            if match:
                self.worst = max(self.worst, float(match.group(1)))

    def stop(self) -> float:
        self.stopping.set()
        self.join(10)
        return self.worst


def batch(fleet: Fleet, prefix: str, url: str) -> tuple[float, float]:
    """Seconds for 20 tasks to be dispatched and succeed; the worst loop lag meanwhile."""
    lag = LagSampler(url)
    lag.start()
    started = time.monotonic()
    for i in range(20):
        fleet.add_task(task(f"{prefix}-{i}").requires("llm"))
    fleet.wait_all(
        lambda items: all(
            (t.get("status") or {}).get("phase") == "Succeeded"
            for t in items
            if t["metadata"]["name"].startswith(prefix)
        ),
        timeout=120,
    )
    return time.monotonic() - started, lag.stop()


def test_a_flood_of_the_claim_port_leaves_dispatch_and_the_api_server_alone(
    control_plane: ControlPlane, fleet: Fleet, tmp_path: Path
) -> None:
    ca = Ca.make()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.write_serving(cert, key, (SERVICE_NAME,))
    fleet.add_worker(worker("w1").capabilities("llm").max_in_flight(4))
    fleet.agent("w1", "complete", work_seconds=0.05)
    port, metrics_port = free_port(), free_port()
    operator = fleet.operator(
        *("--claim-port", str(port), "--metrics-port", str(metrics_port)),
        *("--claim-cert-file", str(cert), "--claim-key-file", str(key)),
    )
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    quiet, quiet_lag = batch(fleet, "quiet", metrics)

    url = f"https://127.0.0.1:{port}/v1/claims/{fleet.namespace}/agentq-xtask-team.job"
    reviews_before = token_reviews(control_plane)
    flood = subprocess.Popen(
        [sys.executable, FLOOD, url, str(FLOOD_SECONDS), "200"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)  # the flood at full strength
        flooded, flooded_lag = batch(fleet, "flooded", metrics)
        out, _ = flood.communicate(timeout=FLOOD_SECONDS + 60)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    reviews = token_reviews(control_plane) - reviews_before
    answers = json.loads(out)
    print(
        f"\nquiet: {quiet:.1f}s (loop lag <= {quiet_lag:.3f}s); flooded: {flooded:.1f}s "
        f"(loop lag <= {flooded_lag:.3f}s); TokenReviews during the flood: {reviews:.0f} "
        f"in {FLOOD_SECONDS:.0f}s; flood answers: {answers}"
    )
    assert operator.popen.poll() is None, operator.text()[-3000:]
    # Dispatch goes on: the flood costs the batch at most a few seconds.
    assert flooded < 3 * quiet + 10, (quiet, flooded, answers)
    # The API server sees the operator's budget of TokenReviews, not the flood's.
    assert reviews <= REVIEW_BURST + REVIEW_RATE * (FLOOD_SECONDS + 10), (reviews, answers)
    assert answers["codes"].get("429", 0) > 0, answers
