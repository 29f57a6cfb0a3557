"""A kubeconfig exec plugin for tests: a script that prints an ExecCredential.

Each run takes the next line of ``credentials`` (a JSON ``status``: a token or a
client certificate, and optionally an expiry), appends what it was given
(arguments, environment, KUBERNETES_EXEC_INFO) to ``runs``, and prints the
credential. A line ``exit N`` makes that run fail with status N.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

SCRIPT = """#!{python}
import json, os, sys
from pathlib import Path
here = Path({here!r})
runs = here / "runs"
done = len(runs.read_text().splitlines()) if runs.exists() else 0
lines = (here / "credentials").read_text().splitlines()
line = lines[min(done, len(lines) - 1)]
with runs.open("a") as out:
    out.write(json.dumps({{"args": sys.argv[1:], "env": os.environ.get("PLUGIN_ENV"),
                          "info": json.loads(os.environ["KUBERNETES_EXEC_INFO"])}}) + "\\n")
if line.startswith("exit "):
    print("plugin failed on purpose", file=sys.stderr)
    sys.exit(int(line.split()[1]))
status = json.loads(line)
api_version = status.pop("apiVersion", "client.authentication.k8s.io/v1")
print(json.dumps({{"apiVersion": api_version, "kind": "ExecCredential", "status": status}}))
"""


class ExecPlugin:
    """The plugin's directory: ``script``, the ``credentials`` it hands out, its ``runs``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.script = self.dir / "plugin.py"
        self.script.write_text(SCRIPT.format(python=sys.executable, here=str(self.dir)))
        self.script.chmod(self.script.stat().st_mode | stat.S_IXUSR)
        self.set([{"token": "unset"}])

    def set(self, statuses: list[dict[str, Any] | str]) -> None:
        """The credentials of the next runs, in order (the last one repeats)."""
        lines = [s if isinstance(s, str) else json.dumps(s) for s in statuses]
        (self.dir / "credentials").write_text("\n".join(lines) + "\n")

    @property
    def runs(self) -> list[dict[str, Any]]:
        path = self.dir / "runs"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def user(self, *, api_version: str = "client.authentication.k8s.io/v1") -> dict[str, Any]:
        """The kubeconfig ``user`` entry that runs this plugin."""
        return {
            "exec": {
                "apiVersion": api_version,
                "command": str(self.script),
                "args": ["--flag", "value"],
                "env": [{"name": "PLUGIN_ENV", "value": "from-kubeconfig"}],
                "interactiveMode": "Never",
                "provideClusterInfo": True,
            }
        }


def token_status(token: str, *, expires: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"token": token}
    if expires:
        status["expirationTimestamp"] = expires
    return status


__all__ = ["ExecPlugin", "token_status"]
