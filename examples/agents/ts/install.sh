#!/bin/sh
# npm ci for the TypeScript example agent, cached per machine (make polyglot-deps).
#
# better-sqlite3 is compiled from source against the machine's Node headers (about 80
# CPU-seconds: no prebuilt binary is downloaded). A fresh clone (CI's) would pay it on
# every run, so the installed node_modules is kept under the cache directory that the
# control plane's build uses (AGENTQ_CACHE_DIR, else XDG_CACHE_HOME/agentq, else
# ~/.cache/agentq), keyed by package.json, package-lock.json and the Node version, and
# copied from there when it matches.
set -eu
cd "$(dirname "$0")"
key=$(cat package.json package-lock.json | sha256sum | cut -c1-16)-node$(node --version)
base=${AGENTQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentq}
cached="$base/npm/agents-ts-$key"
if [ -f "$cached/node_modules/.complete" ]; then
  rm -rf node_modules
  cp -a "$cached/node_modules" node_modules
  rm node_modules/.complete
  echo "node_modules from $cached"
  exit 0
fi
# Compiled here, with these headers: no download of headers or of a prebuilt binary.
if [ -f /usr/include/node/node.h ]; then export npm_config_nodedir=/usr; fi
export npm_config_build_from_source=true
npm ci --no-audit --no-fund --loglevel=error
mkdir -p "$base/npm"
tmp=$(mktemp -d "$base/npm/.agents-ts-XXXXXX")
cp -a node_modules "$tmp/node_modules"
touch "$tmp/node_modules/.complete"
rm -rf "$cached"
mv "$tmp" "$cached" 2>/dev/null || rm -rf "$tmp"  # another run may have put it there first
