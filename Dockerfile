# The agentq image: the operator (`agentq operator`) and, in agent pods, the sidecar.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
USER 65532:65532
ENTRYPOINT ["agentq"]
CMD ["operator"]
