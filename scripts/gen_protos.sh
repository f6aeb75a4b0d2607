#!/usr/bin/env bash
# Generates ragrpc/v1/*_pb2.py, *_pb2_grpc.py and *.pyi from protos/ into OUT_DIR (default: repo root).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-.}
mkdir -p "$OUT/ragrpc/v1"
# google/rpc/status.proto is vendored in third_party/googleapis (its Python code comes with googleapis-common-protos)
"$PY" -m grpc_tools.protoc -I protos -I third_party/googleapis \
  --python_out="$OUT" --grpc_python_out="$OUT" --pyi_out="$OUT" \
  protos/ragrpc/v1/common.proto protos/ragrpc/v1/ingest.proto protos/ragrpc/v1/retrieve.proto
touch "$OUT/ragrpc/v1/__init__.py"
