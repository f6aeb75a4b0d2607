"""Container health check: exit 0 when the gRPC health service at ADDRESS answers SERVING.

    python grpc_health_probe.py 127.0.0.1:50051 [SERVICE] [--timeout SECONDS]
    python grpc_health_probe.py '127.0.0.1:$RAGRPC_QUERY_PORT'

Environment variables in ADDRESS are expanded here, since a HEALTHCHECK in exec form has no shell.

Standard library plus grpcio and grpcio-health-checking (both in the image), so it works
whatever the command-line client looks like. Exit 1: NOT_SERVING, unknown service or no answer.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str, timeout_s: float) -> int:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            print(f"{address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{address} {service or '(server)'}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gRPC health check: exit 0 when SERVING")
    parser.add_argument("address", help="host:port of the gRPC server ($VARS expanded)")
    parser.add_argument("service", nargs="?", default="", help="service name; empty: the whole server")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    return check(os.path.expandvars(args.address), args.service, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
