"""Generic metadata filters on a real milvus-lite server: declared keys as fields of their own, exact
matches in search, query and scan, the deprecated fields' JSON filter on a collection created before
keys could be declared (tests/support/metadata_filter_checks.py; Milvus 2.3.5 runs the same check in
tests/reliability/test_milvus_235.py)."""

from __future__ import annotations

import pytest

from ragrpc.config import Settings
from tests.support.metadata_filter_checks import check_metadata_filters

pytestmark = pytest.mark.slow


def test_metadata_filters_on_milvus_lite(milvus_settings: Settings) -> None:
    rows = check_metadata_filters(milvus_settings, prefix="meta")
    assert len(rows) == 5
