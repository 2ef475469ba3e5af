"""The agent keeps a worker for in-process recovery only if it opted in and has joined the
process group of the generation that failed: a survivor still joining it (blocked in
init_process_group on a replacement that died meanwhile) would never see the next generation,
so the agent stops it and restarts the group instead of waiting on it."""

import os

from elastictrain.runtime.control import ControlChannel, mark_inprocess, opted_in, write_assignment


def test_a_worker_is_kept_only_once_it_has_joined_the_failed_generation(tmp_path):
    ch = ControlChannel(str(tmp_path))
    me = os.getpid()
    assert not opted_in(str(tmp_path), me, 1)  # never opted in
    ch.announce(1)
    assert opted_in(str(tmp_path), me, 1) and opted_in(str(tmp_path), me)
    assert not opted_in(str(tmp_path), me + 1, 1)  # another process (a replacement in the same slot)
    # generation 2 was handed out, and this survivor has not joined its group yet: not kept
    write_assignment(str(tmp_path), 2, {"RANK": "0"})
    assert ch.newer(1)["generation"] == 2
    assert not opted_in(str(tmp_path), me, 2)
    ch.announce(2)  # joined
    assert opted_in(str(tmp_path), me, 2)


def test_a_worker_the_agent_marked_names_no_generation_and_is_taken_at_its_word(tmp_path):
    mark_inprocess(str(tmp_path), 4242)  # Horovod's workers register with the agent instead
    assert opted_in(str(tmp_path), 4242, 7) and not opted_in(str(tmp_path), 4243, 7)
