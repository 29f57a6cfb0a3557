# The agentq image: `agentq operator` (the operator) and `agentq sidecar` (the
# heartbeat sidecar in agent pods); one image, two commands. It holds the product
# (the agentq distribution, operator/) and the agent SDK it runs agent-sim on
# (agentq-agent, sdk/): not the development tools (agentq-dev, tools/), nor pip,
# setuptools or a shell (docs/install.md, "The image").
#
# BASE is any Debian-based image with Python 3.11 and its venv module; only the build
# stage runs on it (the final stage takes the files it needs from there). Elsewhere
# the default, python:3.11-slim, is pulled as usual: for a release, pass it pinned by
# digest (--build-arg BASE=python:3.11-slim@sha256:...; docs/install.md, "The image");
# `make image` passes a local base made from Debian packages (debootstrap), for
# machines with no registry, named by a hash of its recipe.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# /opt/build's pip and setuptools build and install; /opt/agentq, the runtime, gets
# the dependencies and the two wheels only (pip --python installs into it).
RUN python3 -m venv /opt/build && python3 -m venv --without-pip /opt/agentq
WORKDIR /src
# Dependencies first, so a code change reuses this layer and the final image's copy of
# it: every package, transitive ones included, from the lock files (requirements/,
# `make lock`), each file checked against its sha256; nothing else is resolved.
# agentq-agent is built below from sdk/ (it has no dependencies of its own).
COPY requirements/runtime.lock requirements/build.lock ./requirements/
RUN /opt/build/bin/pip --python /opt/agentq/bin/python install --quiet --no-deps \
      --require-hashes -r requirements/runtime.lock \
 && /opt/build/bin/pip install --quiet --no-deps --require-hashes -r requirements/build.lock
# The runtime's root filesystem from the build stage's own files: the interpreter, its
# standard library and the shared libraries they and the venv's extension modules
# load, the CA bundle, passwd/group (image/rootfs.py). No shell, no coreutils, no
# package manager, no pip: the final stage starts from scratch.
COPY image/rootfs.py ./image/
RUN /opt/build/bin/python image/rootfs.py /runtime /opt/agentq

COPY pyproject.toml README.md ./
COPY sdk/pyproject.toml sdk/README.md ./sdk/
COPY operator ./operator
COPY sdk/src ./sdk/src
# The two wheels, installed under /stage (as they will lie in /opt/agentq) so that the
# final image takes them as a small layer of their own.
RUN /opt/build/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /wheels . ./sdk \
 && /opt/build/bin/pip --python /opt/agentq/bin/python install --quiet --root /stage \
      --no-warn-script-location --no-deps --no-index --no-compile /wheels/*.whl \
 && /opt/agentq/bin/python -m compileall -q -s /stage -p / /stage/opt/agentq/lib

FROM scratch
# Runs as uid 65532 with a read-only root filesystem; writes go to a tmpfs at /tmp.
# Libraries look the user up (kopf: getpass.getuser()), and a uid with no passwd
# entry made them crash (KeyError: 'getpwuid(): uid not found: 65532'): the image
# has an entry for 65532, and USER/LOGNAME answer getpass for any other uid a
# cluster may impose (OpenShift's arbitrary uids, say). Probes exec python3 (on PATH,
# the venv's), never a shell.
COPY --from=build /runtime/ /
COPY --from=build /opt/agentq /opt/agentq
COPY --from=build /stage/ /
ENV PATH=/opt/agentq/bin:/usr/local/bin:/usr/bin \
    USER=agentq LOGNAME=agentq HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["agentq"]
CMD ["operator"]
