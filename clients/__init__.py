"""Python clients of ragrpc's IngestService and RetrieveService.

Light on purpose: importing this package loads grpcio, protobuf, google.rpc and the
generated `ragrpc.v1` code only (no torch, pymilvus, numpy or sentence-transformers).

    from clients import IngestClient, RetrieveClient

    with IngestClient("127.0.0.1:50051") as ingest:
        doc = ingest.upload("notes.md")
    with RetrieveClient("127.0.0.1:50052") as query:
        for hit in query.retrieve("what is milvus", top_k=5):
            print(hit.rank, hit.score, hit.title)
        answer = query.ask("what is milvus").drain()
        print(answer.answer, answer.final.model)
"""

from clients.async_client import (
    AsyncAskStream,
    AsyncIngestClient,
    AsyncIngestStream,
    AsyncRetrieveClient,
    AsyncRetrieveStream,
)
from clients.channel import ChannelSettings, create_aio_channel, create_channel, service_config
from clients.convert import NewDocument
from clients.errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    Internal,
    InvalidArgument,
    NotFound,
    RagrpcClientError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from clients.events import (
    AskEvent,
    BatchSummary,
    Citation,
    Final,
    Hit,
    IngestEvent,
    Progress,
    Retraction,
    RetrievalSummary,
    Source,
    Token,
)
from clients.session import ReadYourWrites
from clients.sync_client import (
    AskStream,
    IngestClient,
    IngestStream,
    RetrieveClient,
    RetrieveStream,
    wait_until_serving,
)

__all__ = [
    "ReadYourWrites",
    "AlreadyExists",
    "AskEvent",
    "AskStream",
    "AsyncAskStream",
    "AsyncIngestClient",
    "AsyncIngestStream",
    "AsyncRetrieveClient",
    "AsyncRetrieveStream",
    "BatchSummary",
    "Cancelled",
    "ChannelSettings",
    "Citation",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "Final",
    "Hit",
    "IngestClient",
    "IngestEvent",
    "IngestStream",
    "Internal",
    "InvalidArgument",
    "NewDocument",
    "NotFound",
    "Progress",
    "RagrpcClientError",
    "ResourceExhausted",
    "Retraction",
    "RetrievalSummary",
    "RetrieveClient",
    "RetrieveStream",
    "Source",
    "Token",
    "Unauthenticated",
    "Unavailable",
    "create_aio_channel",
    "create_channel",
    "from_rpc_error",
    "service_config",
    "wait_until_serving",
]
