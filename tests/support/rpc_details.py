"""The google.rpc details a failed gRPC call carries (ErrorInfo, BadRequest, RetryInfo), by type name."""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

DETAIL_KINDS = (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo)


def rpc_details(error: grpc.RpcError) -> dict[str, Any]:
    """{"ErrorInfo": ..., "BadRequest": ..., "RetryInfo": ...} for those present; {"_malformed": True}
    when the status itself cannot be read (the caller's assertion reports it)."""
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001
        return {"_malformed": True}
    found: dict[str, Any] = {}
    for detail in status.details if status else []:
        for kind in DETAIL_KINDS:
            message = kind()
            if detail.Is(message.DESCRIPTOR):
                detail.Unpack(message)
                found[kind.__name__] = message
    return found
