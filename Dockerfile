# The agentq image: `agentq operator` (the operator) and `agentq sidecar` (the
# heartbeat sidecar in agent pods); one image, two commands.
#
# BASE is any Debian-based image with Python 3.11 and its venv module. Elsewhere
# the default, python:3.11-slim, is pulled as usual; `make image` passes a local
# base made from Debian packages (debootstrap), for machines with no registry.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/agentq
WORKDIR /src
# Dependencies first (pinned in pyproject.toml, with the build backend), so a code
# change reuses this layer and the final image's copy of it.
COPY pyproject.toml README.md ./
RUN /opt/agentq/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' > /tmp/requirements.txt \
 && /opt/agentq/bin/pip install --quiet -r /tmp/requirements.txt
COPY operator ./operator
RUN /opt/agentq/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${BASE}
# Runs as uid 65532 with a read-only root filesystem; writes go to a tmpfs at /tmp.
# Libraries look the user up (kopf: getpass.getuser()), and a uid with no passwd
# entry made them crash (KeyError: 'getpwuid(): uid not found: 65532'): the image
# has an entry for 65532, and USER/LOGNAME answer getpass for any other uid a
# cluster may impose (OpenShift's arbitrary uids, say).
RUN echo 'agentq:x:65532:65532:agentq:/tmp:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'agentq:x:65532:' >> /etc/group
COPY --from=build /opt/agentq /opt/agentq
COPY --from=build /wheels /tmp/wheels
RUN /opt/agentq/bin/pip install --quiet --no-deps --no-index --no-compile /tmp/wheels/*.whl \
 && /opt/agentq/bin/python -m compileall -q /opt/agentq/lib/python3*/site-packages/agentq \
 && rm -rf /tmp/wheels
ENV PATH=/opt/agentq/bin:$PATH \
    USER=agentq LOGNAME=agentq HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["agentq"]
CMD ["operator"]
