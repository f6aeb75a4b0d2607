"""The ingest service takes its start-up heap out of the garbage collector's passes (ragrpc.server)."""

from __future__ import annotations

import gc

from ragrpc.server import freeze_startup_heap


def test_start_up_objects_leave_the_collected_generations_and_young_collections_come_less_often() -> None:
    kept = [["start-up", [n]] for n in range(1000)]  # objects alive when the service has started
    before = gc.get_threshold()
    try:
        assert all(gc.is_tracked(o) for o in kept)
        frozen = freeze_startup_heap(young_threshold=5000)
        # (the frozen count falls again as frozen objects that other tests left are freed by reference counting)
        assert frozen >= len(kept) and gc.get_freeze_count() > 0
        collected = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
        assert not any(id(o) in collected for o in kept)
        assert gc.get_threshold()[0] == 5000
        later = [["later", [n]] for n in range(10)]  # what the service allocates afterwards is collected as before
        assert all(gc.is_tracked(o) for o in later)
        youngest = {id(o) for o in gc.get_objects(0)}
        assert any(id(o) in youngest for o in later)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
