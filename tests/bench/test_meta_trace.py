"""bench/meta_trace.py and its caching-allocator replay: the rules, and one small traced case."""

from __future__ import annotations

import pytest

from _allocator_replay import MIB, CachingAllocator, least_capacity, replay


def test_small_requests_share_2mib_segments_and_large_ones_get_their_own():
    a = CachingAllocator()
    a.malloc("s1", 100)  # rounded to 512, small pool: one 2 MiB segment
    a.malloc("s2", 1000)
    assert a.reserved == 2 * MIB and a.allocated == 512 + 1024
    a.malloc("m", 5 * MIB)  # under 10 MiB: a 20 MiB segment, split
    assert a.reserved == 22 * MIB
    a.malloc("m2", 12 * MIB)  # fits in the 15 MiB left of that segment
    assert a.reserved == 22 * MIB
    a.malloc("big", 30 * MIB + 1)  # its own segment, rounded up to 2 MiB
    assert a.reserved == 22 * MIB + 32 * MIB


def test_freed_blocks_merge_and_are_reused_before_new_segments():
    a = CachingAllocator()
    for k in ("a", "b", "c"):
        a.malloc(k, 40 * MIB)
    assert a.reserved == 120 * MIB
    a.free("a")
    a.free("b")
    a.malloc("d", 60 * MIB)  # no merge across segments: a new one
    assert a.reserved == 180 * MIB
    a.free("c")
    a.malloc("e", 30 * MIB)  # best fit: a cached 40 MiB block, not a new segment
    assert a.reserved == 180 * MIB and a.reserved_peak == 180 * MIB
    # within one segment, neighbours merge: two halves freed become one block again
    b = CachingAllocator()
    b.malloc("x", 40 * MIB)
    b.free("x")
    b.malloc("y", 20 * MIB)
    b.malloc("z", 20 * MIB)
    b.free("y")
    b.free("z")
    b.malloc("w", 40 * MIB)
    assert b.reserved == 40 * MIB


def test_at_capacity_free_segments_are_released_and_the_request_retried():
    events = [("alloc", 1, 40 * MIB), ("free", 1, 0), ("alloc", 2, 50 * MIB)]
    assert replay(events).reserved_peak == 90 * MIB
    assert replay(events, capacity_bytes=60 * MIB).reserved_peak == 50 * MIB
    with pytest.raises(MemoryError):
        replay([("alloc", 1, 40 * MIB), ("alloc", 2, 50 * MIB)], capacity_bytes=60 * MIB)


def test_least_capacity_lies_between_the_allocated_and_the_free_running_reserved_peak():
    # a freed 40 MiB block cannot hold 50 MiB: free-running, both stay reserved (90 MiB); with less
    # room the allocator releases the cached segment and the sequence runs in 50 MiB
    events = [("alloc", 1, 40 * MIB), ("free", 1, 0), ("alloc", 2, 50 * MIB)]
    assert 50 * MIB <= least_capacity(events, step_bytes=MIB) <= 51 * MIB  # bisection to 1 MiB
    # two live blocks in separate segments: nothing to give back, the least capacity is their sum
    held = [("alloc", 1, 40 * MIB), ("alloc", 2, 50 * MIB), ("free", 1, 0), ("alloc", 3, 45 * MIB)]
    assert replay(held).reserved_peak == 136 * MIB  # 40 + 50 + 46 (45 MiB rounded up to 2 MiB)
    assert 96 * MIB <= least_capacity(held, step_bytes=MIB) <= 97 * MIB  # 50 MiB kept + 45 MiB rounded to 46


def test_a_traced_step_matches_the_memory_model_and_its_replay_holds_it():
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    import meta_trace as mt

    from trainfit.core.memory import estimate_memory
    from trainfit.core.models.catalog import get_model

    mt._register_flash_attention()
    spec = get_model("Qwen/Qwen2.5-0.5B")
    for setup in (mt._s("lora", micro_batch=2, seq_len=512), mt._s(micro_batch=1, seq_len=256, grad_checkpointing="none")):
        rec = mt.trace(spec, setup)
        traced = rec.traced_peak_bytes()
        predicted = estimate_memory(spec, setup).devices[0].tensor_peak_bytes
        assert abs(predicted - traced) / traced < 0.01, (setup, predicted, traced)
        alloc = replay(rec.events)
        assert alloc.allocated_peak >= traced  # block rounding only adds
        assert alloc.reserved_peak >= alloc.allocated_peak
