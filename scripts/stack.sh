#!/usr/bin/env bash
# Starts/stops the local stack as three processes: milvus-lite server, ingest service, query service.
# Each writes its own log under data/logs/ and its pid under data/run/.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
DATA=${RAGRPC_DATA_DIR:-data}
MILVUS_PORT=${RAGRPC_MILVUS_PORT:-19530}
export RAGRPC_MILVUS_URI=${RAGRPC_MILVUS_URI:-http://127.0.0.1:${MILVUS_PORT}}
export RAGRPC_INGEST_PORT=${RAGRPC_INGEST_PORT:-50051}
export RAGRPC_QUERY_PORT=${RAGRPC_QUERY_PORT:-50052}
mkdir -p "$DATA/logs" "$DATA/run" "$DATA/milvus"

pid_alive() { [ -f "$DATA/run/$1.pid" ] && kill -0 "$(cat "$DATA/run/$1.pid")" 2>/dev/null; }

start_one() {  # name, command...
  local name=$1; shift
  if pid_alive "$name"; then echo "$name already running (pid $(cat "$DATA/run/$name.pid"))"; return; fi
  nohup "$@" >"$DATA/logs/$name.log" 2>&1 &
  echo $! >"$DATA/run/$name.pid"
  echo "started $name (pid $!, log $DATA/logs/$name.log)"
}

wait_port() {  # name, port, seconds
  local name=$1 port=$2 deadline=$((SECONDS + $3))
  until "$VENV/bin/python" -c "import socket,sys; s=socket.socket(); s.settimeout(0.5); sys.exit(s.connect_ex(('127.0.0.1',$port)))" 2>/dev/null; do
    if ! pid_alive "$name"; then echo "$name exited; see $DATA/logs/$name.log" >&2; tail -20 "$DATA/logs/$name.log" >&2; return 1; fi
    if [ $SECONDS -ge $deadline ]; then echo "$name did not open port $port in time" >&2; return 1; fi
    sleep 0.5
  done
}

wait_serving() {  # name, port, seconds
  "$VENV/bin/python" -m clients.cli --target "127.0.0.1:$2" health --wait "$3" >/dev/null \
    || { echo "$1 is not SERVING; see $DATA/logs/$1.log" >&2; tail -20 "$DATA/logs/$1.log" >&2; return 1; }
  echo "$1 SERVING on 127.0.0.1:$2"
}

stop_one() {
  local name=$1
  if pid_alive "$name"; then
    local pid; pid=$(cat "$DATA/run/$name.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
    echo "stopped $name"
  fi
  rm -f "$DATA/run/$name.pid"
}

case "${1:-}" in
  start)
    if [[ "$RAGRPC_MILVUS_URI" == "http://127.0.0.1:${MILVUS_PORT}" ]]; then
      start_one milvus "$VENV/bin/milvus-lite" server --data-dir "$DATA/milvus" --host 127.0.0.1 --port "$MILVUS_PORT"
      wait_port milvus "$MILVUS_PORT" 60
    fi
    start_one ingest "$VENV/bin/python" -m ingest_service
    wait_serving ingest "$RAGRPC_INGEST_PORT" 180
    start_one query "$VENV/bin/python" -m query_service
    wait_serving query "$RAGRPC_QUERY_PORT" 180
    ;;
  stop)
    stop_one query; stop_one ingest; stop_one milvus ;;
  status)
    for n in milvus ingest query; do if pid_alive $n; then echo "$n running (pid $(cat "$DATA/run/$n.pid"))"; else echo "$n stopped"; fi; done ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
