#!/usr/bin/env bash
# make demo: start the stack, ingest the sample folder, ask a question, print the streamed answer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/stack.sh start
CLI=(.venv/bin/python -m clients.cli)
"${CLI[@]}" --ingest "127.0.0.1:${RAGRPC_INGEST_PORT:-50051}" ingest samples/
echo
QUESTION=${DEMO_QUESTION:-"How does the ingest service keep the collection consistent when it crashes?"}
echo "Q: $QUESTION"
"${CLI[@]}" --query "127.0.0.1:${RAGRPC_QUERY_PORT:-50052}" ask "$QUESTION"
echo
echo "The stack is still running (make stop to end it; logs in data/logs/)."
