"""Item ids held as one Arrow string array, found by binary search (no Python object per item)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


class ItemIds(Sequence):
    """The item ids in item-table order, held as one Arrow string array (a few bytes per id,
    no Python object per item: 10M ids are ~160 MB, not the ~1.5 GB of a list and a dict).
    ``position`` finds an id by binary search in a sorted order made on first use."""

    def __init__(self, ids):
        import pyarrow as pa

        self.array = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else pa.array(ids, pa.string())
        self._by_id: tuple | None = None  # (order, sorted ids), made on first use

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, p):
        if isinstance(p, slice):
            return self.array[p].to_pylist()
        return self.array[int(p)].as_py()

    def __iter__(self):
        return iter(self.array.to_pylist())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    def duplicates(self) -> int:
        """Ids that occur more than once (counted once each beyond the first)."""
        import pyarrow.compute as pc

        _, s = self._sort()
        return 0 if len(s) < 2 else int(pc.sum(pc.equal(s[1:], s[:-1])).as_py() or 0)

    def position(self, item_id: str) -> int:
        """The row of ``item_id``; KeyError when it is not indexed."""
        import bisect

        order, s = self._sort()
        j = bisect.bisect_left(_Strings(s), item_id)
        if j == len(s) or s[j].as_py() != item_id:
            raise KeyError(item_id)
        return int(order[j])

    def _sort(self) -> tuple:
        # One assignment of both: a Serve replica calls this from several threads at once, and
        # a thread must never see the order without the sorted ids.
        if self._by_id is None:
            import pyarrow.compute as pc

            order = pc.sort_indices(self.array).to_numpy()
            self._by_id = (order, self.array.take(order))
        return self._by_id


class _Strings:
    """A sorted Arrow string array as ``bisect`` reads it."""

    def __init__(self, array):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> str:
        return self.array[i].as_py()


class Rows:
    """``item_id -> (offset, count)`` over arrays (the node store's table): what a dict of a
    million items would hold, without a Python object per item."""

    def __init__(self, ids: ItemIds, offsets: np.ndarray, counts: np.ndarray):
        self.ids, self.offsets, self.counts = ids, offsets, counts

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, item_id: str) -> bool:
        return self.get(item_id) is not None

    def get(self, item_id: str) -> tuple[int, int] | None:
        try:
            p = self.ids.position(item_id)
        except KeyError:
            return None
        return int(self.offsets[p]), int(self.counts[p])
