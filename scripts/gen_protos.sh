#!/usr/bin/env bash
# Generates ragrpc/v1/*_pb2.py, *_pb2_grpc.py and *.pyi from protos/ into OUT_DIR (default: repo root).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-.}
mkdir -p "$OUT/ragrpc/v1"
# google/rpc/status.proto ships with googleapis-common-protos (a dependency of grpcio-status)
GOOGLEAPIS=$("$PY" -c 'import google.rpc.status_pb2 as m, pathlib; print(pathlib.Path(m.__file__).parents[2])')
"$PY" -m grpc_tools.protoc -I protos -I "$GOOGLEAPIS" \
  --python_out="$OUT" --grpc_python_out="$OUT" --pyi_out="$OUT" \
  protos/ragrpc/v1/common.proto protos/ragrpc/v1/ingest.proto protos/ragrpc/v1/retrieve.proto
touch "$OUT/ragrpc/v1/__init__.py"
