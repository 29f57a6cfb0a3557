"""agentq: a fair-share task queue for fleets of AI agents, as a Kubernetes operator.

The contract (names, resources, behaviour) is written down in
``docs/`` (api.md, concepts.md, operator.md). Subpackages own one job each:

- ``agentq.scheduler``: the pure dispatch core (weighted deficit round-robin).
- ``agentq.operator``, ``agentq.sidecar``: the two commands of the image.
- ``agentq.cli``: the ``agentq`` / ``kubectl agentq`` command line.

Three distributions contribute to this package (docs/install.md, "Distributions"):
``agentq`` (this directory: the product), ``agentq-agent`` (``agentq.agent`` and
``agentq.fencing``, the agent SDK, in ``sdk/``) and ``agentq-dev`` (the embedded
control plane, the demo, the simulator and test doubles, in ``tools/``). Installed
from wheels they share one directory; installed editable from a checkout each
source root is on ``sys.path``, and ``extend_path`` joins their ``agentq``
directories into this package.
"""

from pkgutil import extend_path

# In place: __path__ is also this module's spec's submodule_search_locations, which
# tools that find the package's files (import-linter's grimp) read.
__path__[:] = extend_path(__path__, __name__)

__version__ = "0.1.0"

GROUP = "agentq.dev"
VERSION = "v1alpha1"
