"""Pending batches in a checkpoint (`bapsql.train.algo.staleness`): those written before bapsql/train/ was split into
sub-packages name their classes by the old module paths and must still load (a pipelined run resumes across it)."""

import pickle

import pytest

from bapsql.train.algo.filter import FillResult
from bapsql.train.algo.staleness import PENDING_FORMAT, PendingBatch, dumps_pending, loads_pending


def _old_bytes(batches: list[PendingBatch]) -> bytes:
    """The pickle the code before the split wrote: the same objects, their classes under the old module paths
    (protocol 2 names them as text, so the paths can be swapped in place)."""
    data = pickle.dumps({"format": PENDING_FORMAT, "batches": batches}, protocol=2)
    for new, old in ((b"bapsql.train.algo.staleness", b"bapsql.train.staleness"),
                     (b"bapsql.train.algo.filter", b"bapsql.train.filter")):
        assert new in data
        data = data.replace(new, old)
    return data


def test_pending_batches_written_before_the_split_still_load():
    fill = FillResult(kept=[], rounds=1, drawn=3, histogram=(1, 2, 0), starved=True)
    batch = PendingBatch(target=4, version=3, fill=fill, drawn=(), rollout_s=1.5, generated=24)
    old = _old_bytes([batch])
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(old)  # the old paths are gone: a plain unpickler cannot resume such a checkpoint
    assert loads_pending(old) == [batch]
    assert loads_pending(dumps_pending([batch])) == [batch]
