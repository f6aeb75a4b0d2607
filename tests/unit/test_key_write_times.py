"""The writer's per-key write timestamps (ragrpc.store.key_write_times): which guarantee a read by
key names after writes, failed writes, deletes by filter, and once entries age out."""

from __future__ import annotations

from ragrpc.store.key_write_times import KeyWriteTimes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _followed(floor: int = 50, keep_s: float = 30.0) -> tuple[KeyWriteTimes, Clock]:
    clock = Clock()
    times = KeyWriteTimes(keep_s=keep_s, clock=clock)
    times.follow("docs", floor)
    return times, clock


def _customized(ts: int) -> dict[str, object]:
    return {"consistency_level": "Customized", "guarantee_timestamp": ts}


def test_a_read_names_the_newest_write_of_its_keys_not_of_the_collection() -> None:
    times, _ = _followed(floor=50)
    times.wrote("docs", ["a"], 100)
    times.wrote("docs", ["b", "c"], 200)
    times.wrote("docs", ["a"], 300)
    assert times.read_options("docs", ["b"]) == _customized(200)  # not 300: a's write is not waited for
    assert times.read_options("docs", ["a", "c"]) == _customized(300)
    assert times.read_options("docs", ["never-written"]) == _customized(50)  # the floor
    assert times.read_options("other", ["a"]) == {}  # not followed: the collection's own level


def test_without_any_write_known_the_read_waits_for_nothing() -> None:
    times, _ = _followed(floor=0)
    assert times.read_options("docs", ["x"]) == _customized(1)  # pymilvus' "eventually" timestamp


def test_a_failed_write_makes_its_keys_strong_until_one_succeeds() -> None:
    times, _ = _followed()
    times.wrote("docs", ["a"], 100)
    times.failed("docs", ["a", "b"])
    assert times.read_options("docs", ["a"]) == {"consistency_level": "Strong"}
    assert times.read_options("docs", ["c", "b"]) == {"consistency_level": "Strong"}
    assert times.read_options("docs", ["c"]) == _customized(50)
    times.wrote("docs", ["a"], 400)
    assert times.read_options("docs", ["a"]) == _customized(400)
    assert times.read_options("docs", ["b"]) == {"consistency_level": "Strong"}


def test_a_delete_by_filter_raises_the_floor_and_a_failed_one_makes_every_read_strong() -> None:
    times, _ = _followed(floor=50)
    times.wrote("docs", ["a"], 100)
    times.wrote("docs", None, 500)  # any key may have changed at 500
    assert times.read_options("docs", ["a"]) == _customized(500)
    assert times.read_options("docs", ["zzz"]) == _customized(500)
    times.failed("docs", None)
    assert times.read_options("docs", ["a"]) == {"consistency_level": "Strong"}
    times.wrote("docs", ["b"], 700)  # a later write: the failed delete, if applied, came before it
    assert times.read_options("docs", ["a"]) == _customized(700)


def test_old_entries_fold_into_the_floor_and_uncertain_ones_stay() -> None:
    times, clock = _followed(floor=50, keep_s=30.0)
    times.wrote("docs", ["a"], 100)
    times.failed("docs", ["u"])
    clock.now += 10
    times.wrote("docs", ["b"], 200)
    clock.now += 25  # a is 35 s old, b 25 s
    times.wrote("docs", ["c"], 300)
    assert times.size("docs") == 3  # a dropped; u kept; b and c
    assert times.read_options("docs", ["a"]) == _customized(100)  # the floor took a's timestamp
    assert times.read_options("docs", ["u"]) == {"consistency_level": "Strong"}
    clock.now += 40
    times.wrote("docs", ["d"], 400)
    assert times.read_options("docs", ["b", "c"]) == _customized(300)
    assert times.read_options("docs", ["u"]) == {"consistency_level": "Strong"}
    assert times.size("docs") == 2  # u and d


def test_a_write_whose_timestamp_cannot_be_read_returns_the_collection_to_session_reads() -> None:
    times, _ = _followed()
    times.wrote("docs", ["a"], 100)
    times.wrote("docs", ["b"], 0)
    assert times.read_options("docs", ["a"]) == {} and times.read_options("docs", ["zzz"]) == {}
    times.failed("docs", ["a"])
    times.wrote("docs", ["a"], 900)
    assert times.read_options("docs", ["a"]) == {}


def test_an_answer_without_a_new_timestamp_makes_its_keys_strong_where_timestamps_are_reported() -> None:
    times, _ = _followed(floor=50)  # the writer lease's write was answered with a timestamp
    times.answered("docs", ["a"], before=0, after=0)  # a delete, the collection's first write in this process
    assert times.read_options("docs", ["a"]) == {"consistency_level": "Strong"}
    times.answered("docs", ["b"], before=0, after=120)
    times.answered("docs", ["b"], before=120, after=120)  # a delete of b after it
    assert times.read_options("docs", ["b"]) == {"consistency_level": "Strong"}
    times.answered("docs", ["b"], before=120, after=130)
    assert times.read_options("docs", ["b"]) == _customized(130)


def test_where_no_write_is_ever_answered_with_a_timestamp_reads_keep_the_session_level() -> None:
    times, _ = _followed(floor=0)  # milvus-lite: no timestamps at all
    times.answered("docs", ["a"], before=0, after=0)
    assert times.read_options("docs", ["a"]) == {} and times.read_options("docs", ["x"]) == {}
