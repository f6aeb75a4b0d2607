"""ragrpc.store.prefetch: a scan's next page is read while the caller works on the current one."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ragrpc import errors
from ragrpc.store.prefetch import prefetched

WAIT_S = 5.0


class Source:
    """Pages 0..n-1; records which pages were asked for and whether it was closed."""

    def __init__(self, pages: int, fail_at: int | None = None) -> None:
        self.pages = pages
        self.fail_at = fail_at
        self.asked: list[int] = []
        self.asked_event = threading.Condition()
        self.closed = threading.Event()
        self.thread_names: set[str] = set()

    def __iter__(self) -> Iterator[list[int]]:
        try:
            for page in range(self.pages):
                self.thread_names.add(threading.current_thread().name)
                with self.asked_event:
                    self.asked.append(page)
                    self.asked_event.notify_all()
                if page == self.fail_at:
                    raise errors.UnavailableError("the store went away")
                yield [page]
        finally:
            self.closed.set()

    def wait_asked(self, page: int, timeout_s: float = WAIT_S) -> bool:
        with self.asked_event:
            return self.asked_event.wait_for(lambda: page in self.asked, timeout=timeout_s)


def test_pages_come_in_order_and_the_source_is_read_in_another_thread() -> None:
    source = Source(pages=50)
    assert list(prefetched(iter(source), name="scan-test")) == [[page] for page in range(50)]
    assert source.thread_names == {"scan-test"}
    assert source.closed.wait(WAIT_S)


def test_the_next_page_is_read_while_the_caller_holds_the_current_one() -> None:
    source = Source(pages=3)
    pages = prefetched(iter(source))
    assert next(pages) == [0]
    # the caller has not asked for page 1 yet, and it is already being read (one ahead, not more)
    assert source.wait_asked(1)
    assert not source.wait_asked(3, timeout_s=0.3)
    assert list(pages) == [[1], [2]]


def test_an_error_of_the_source_reaches_the_caller_after_the_pages_before_it() -> None:
    source = Source(pages=5, fail_at=2)
    seen: list[list[int]] = []
    with pytest.raises(errors.UnavailableError, match="went away"):
        for page in prefetched(iter(source)):
            seen.append(page)
    assert seen == [[0], [1]]
    assert source.closed.wait(WAIT_S)


def test_a_caller_that_stops_early_closes_the_source_and_nothing_more_is_read() -> None:
    source = Source(pages=1_000)
    pages = prefetched(iter(source))
    assert next(pages) == [0]
    pages.close()
    assert source.closed.wait(WAIT_S)
    assert len(source.asked) <= 3  # the page in hand, the one prefetched, at most one being put


def test_an_empty_source_ends_at_once() -> None:
    source = Source(pages=0)
    assert list(prefetched(iter(source))) == []
    assert source.closed.wait(WAIT_S)


def test_the_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        list(prefetched(iter([[1]]), depth=0))
