#!/usr/bin/env bash
# Fails when the committed ragrpc/v1 code differs from what the protos generate.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PYTHON=${PYTHON:-.venv/bin/python} bash scripts/gen_protos.sh "$tmp" >/dev/null
if diff -r -x __pycache__ "$tmp/ragrpc/v1" ragrpc/v1; then
  echo "proto-check: generated code matches protos/"
else
  echo "proto-check: ragrpc/v1 is out of date; run 'make proto' and commit the result" >&2
  exit 1
fi
