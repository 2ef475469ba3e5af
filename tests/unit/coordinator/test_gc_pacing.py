"""coordinator/gc_pacing.py: what survives a full collection is frozen out of the collector's
sight (at start, after each full collection the interpreter makes, and on the schedule), and
cyclic garbage frozen while in use is collected at the next scheduled pass."""

import asyncio
import gc
import weakref

import pytest

from elastictrain.coordinator.gc_pacing import Freezer


class Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def freezer():
    f = Freezer(every=60.0)
    try:
        yield f
    finally:
        f.uninstall()
        gc.unfreeze()


def test_a_pass_freezes_what_survives_and_frees_frozen_garbage_at_the_next(freezer):
    kept = [Node() for _ in range(1000)]
    dropped = Node()
    ref = weakref.ref(dropped)
    assert freezer.freeze() >= 0.0 and freezer.passes == 1
    assert freezer.frozen() >= len(kept)
    counted = freezer.frozen()
    newer = [Node() for _ in range(500)]
    assert freezer.frozen() == counted  # counted once per freeze (a scrape does not walk them all again)
    del dropped
    gc.collect()
    assert ref() is not None  # frozen: the collector does not see it
    freezer.freeze()
    assert ref() is None and freezer.passes == 2  # the next pass puts it back first, and collects it
    # (and froze the newer ones, and counts anew: others frozen at the first pass may have been freed since)
    seen = {id(o) for o in gc.get_objects()}  # (the frozen ones are out of its sight)
    assert not any(id(n) in seen for n in newer) and freezer.frozen() == gc.get_freeze_count() != counted
    freezer.uninstall()
    assert freezer.frozen() == 0
    with pytest.raises(ValueError, match="every must be > 0"):
        Freezer(every=0)


def test_the_survivors_of_the_interpreters_full_collection_are_frozen_on_the_loop(freezer):
    async def main():
        freezer.install(asyncio.get_running_loop())
        kept = [Node() for _ in range(1000)]
        gc.unfreeze()
        gc.collect(1)  # (a younger collection: nothing to do)
        await asyncio.sleep(0)
        assert freezer.survivors == 0
        gc.collect()  # a full one, as the interpreter makes when the old objects have grown enough
        assert freezer.survivors == 0  # (frozen on the loop, not inside the collector)
        await asyncio.sleep(0)
        assert freezer.survivors == 1 and freezer.frozen() >= len(kept)

    asyncio.run(main())
    assert Freezer.full_collections() >= 1
