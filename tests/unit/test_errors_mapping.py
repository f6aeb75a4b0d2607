"""The one mapping from the error tree to gRPC codes and google.rpc details."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from ragrpc import errors
from ragrpc.grpc_errors import rich_status, status_code_for


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.InvalidInputError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.UnsupportedMediaTypeError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.DocumentParseError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.PasswordError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.LimitExceededError("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.NotFoundError("x"), grpc.StatusCode.NOT_FOUND),
        (errors.AlreadyExistsError("x"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.ModelMismatchError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.UnauthenticatedError("x"), grpc.StatusCode.UNAUTHENTICATED),
        (errors.UnavailableError("x"), grpc.StatusCode.UNAVAILABLE),
        (errors.DeadlineError("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.InternalError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_every_error_maps_to_its_code(error: errors.RagrpcError, code: grpc.StatusCode) -> None:
    assert status_code_for(error) == code
    assert errors.status_name(error) == code.name


def _details(status) -> dict[str, object]:  # type: ignore[no-untyped-def]
    found: dict[str, object] = {}
    for any_detail in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo):
            message = kind()
            if any_detail.Is(message.DESCRIPTOR):
                any_detail.Unpack(message)
                found[kind.__name__] = message
    return found


def test_invalid_input_carries_field_violation_and_reason() -> None:
    code, status = rich_status(errors.InvalidInputError("query must not be empty", field="query"))
    details = _details(status)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert status.message == "query must not be empty"
    assert details["ErrorInfo"].reason == "INVALID_INPUT"
    assert details["ErrorInfo"].domain == "ragrpc.v1"
    violation = details["BadRequest"].field_violations[0]
    assert (violation.field, violation.description) == ("query", "query must not be empty")


def test_unavailable_carries_retry_info() -> None:
    _, status = rich_status(errors.UnavailableError("store down", retry_after_s=2.5))
    retry = _details(status)["RetryInfo"]
    assert retry.retry_delay.ToMilliseconds() == 2500


def test_metadata_reaches_error_info() -> None:
    _, status = rich_status(errors.LimitExceededError("too big", metadata={"limit_bytes": "10"}))
    assert dict(_details(status)["ErrorInfo"].metadata) == {"limit_bytes": "10"}
