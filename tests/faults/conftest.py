"""The fault tests' rig: a real ingest service over the in-memory fakes behind the fault harness."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.faults.rig import IngestRig


@pytest.fixture
async def rig() -> AsyncIterator[IngestRig]:
    started = await IngestRig.start()
    try:
        yield started
    finally:
        await started.stop()
