"""``TorchCheckpointer(rng=...)``: the process's global random states by default, a job's own
generators when given (every kind a script uses), none inside ``etrun --group`` unless given
(the global ones are the group's), and clear errors when a resume does not match its save."""

import logging
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from elastictrain.errors import ConfigError  # noqa: E402
from elastictrain.runtime import jobctx  # noqa: E402
from elastictrain_torch import RNGState, TorchCheckpointer  # noqa: E402


def _draws(gens):
    out = []
    for g in gens:
        if isinstance(g, torch.Generator):
            out.append(torch.rand(3, generator=g).tolist())
        elif isinstance(g, random.Random):
            out.append([g.random() for _ in range(3)])
        else:
            out.append(g.random(3).tolist())
    return out


def _gens():
    return [torch.Generator().manual_seed(1), random.Random(2), np.random.default_rng(3), np.random.RandomState(4)]


def test_own_generators_are_saved_and_restored_through_a_checkpoint(tmp_path):
    gens = _gens()
    _draws(gens)
    ck = TorchCheckpointer(str(tmp_path), rng=gens)
    ck.save(1)
    ck.wait()
    expected = _draws(gens)  # what each draws next after the save
    _draws(gens)
    fresh = _gens()  # a new process: the same generators, seeded afresh
    again = TorchCheckpointer(str(tmp_path), rng=fresh)
    assert again.restore() is not None
    assert _draws(fresh) == expected
    torch.manual_seed(5)
    before = torch.rand(2)
    torch.manual_seed(5)  # the global generator was not touched by the restore
    assert torch.equal(before, torch.rand(2))
    ck.close() if hasattr(ck, "close") else None


def test_the_global_states_by_default_and_a_mismatch_names_the_fix(tmp_path):
    torch.manual_seed(11)
    random.seed(12)
    ck = TorchCheckpointer(str(tmp_path / "global"))
    ck.save(1)
    ck.wait()
    expected = (torch.rand(2).tolist(), random.random())
    torch.manual_seed(0)
    random.seed(0)
    assert TorchCheckpointer(str(tmp_path / "global")).restore() is not None
    assert (torch.rand(2).tolist(), random.random()) == expected
    with pytest.raises(ConfigError, match="holds the global random states, but this checkpointer was given "
                                          "generators' states .1.; pass the same rng="):
        TorchCheckpointer(str(tmp_path / "global"), rng=torch.Generator()).restore()
    own = TorchCheckpointer(str(tmp_path / "own"), rng=[torch.Generator(), random.Random()])
    own.save(1)
    own.wait()
    with pytest.raises(ConfigError, match=r"holds generators' states \(2\), but this checkpointer was given "
                                          r"generators' states \(1\)"):
        TorchCheckpointer(str(tmp_path / "own"), rng=torch.Generator()).restore()
    with pytest.raises(ConfigError, match="rng: int is not a random generator"):
        TorchCheckpointer(str(tmp_path / "bad"), rng=3)
    # saved without random states (rng=False, or inside a group): the rest restores, the RNG stays
    plain = TorchCheckpointer(str(tmp_path / "plain"), rng=False)
    plain.save(1)
    plain.wait()
    torch.manual_seed(21)
    assert TorchCheckpointer(str(tmp_path / "plain")).restore() is not None
    torch.manual_seed(21)
    assert RNGState().state_dict()["torch"].equal(torch.get_rng_state())


def test_inside_a_group_the_shared_global_states_are_left_out_and_the_job_told(tmp_path, caplog):
    with jobctx.bound(jobctx.JobContext("a", ["a.py"])):
        with caplog.at_level(logging.WARNING, logger="elastictrain.checkpoint"):
            ck = TorchCheckpointer(str(tmp_path / "a"))
        assert "rng" not in ck.state
        assert "shared by the jobs of this group" in caplog.text and "rng=gen" in caplog.text
        caplog.clear()
        own = TorchCheckpointer(str(tmp_path / "b"), rng=torch.Generator())
        assert isinstance(own.state["rng"], RNGState) and not caplog.text
