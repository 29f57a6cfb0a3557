#!/bin/sh
# The example agents' request and response types, generated from the OpenAPI file of
# the agent API (docs/agent-api.openapi.yaml): Go by oapi-codegen (a tool of go/go.mod),
# TypeScript by openapi-typescript (ts/package.json). Both pinned, so the output is
# exactly reproducible: `make polyglot-generate` writes them in place; with a DIR it
# writes DIR/types.gen.go and DIR/api.gen.ts instead, which the tests compare with the
# committed files (tests/integration/test_agents_polyglot.py).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
spec="$here/../../docs/agent-api.openapi.yaml"
if [ $# -gt 0 ]; then
  mkdir -p "$1"
  out=$(cd "$1" && pwd)
  go_out="$out/types.gen.go"
  ts_out="$out/api.gen.ts"
else
  go_out="$here/go/sidecar/types.gen.go"
  ts_out="$here/ts/src/api.gen.ts"
fi
(cd "$here/go" && go tool oapi-codegen -config sidecar/oapi-codegen.yaml -o "$go_out" "$spec")
(cd "$here/ts" && node_modules/.bin/openapi-typescript "$spec" --default-non-nullable false \
  --output "$ts_out" >/dev/null)
