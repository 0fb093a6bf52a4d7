"""Group keys as int64 ids: a column of key ids sorts, compares and groups at C speed.

Two codings. :class:`KeyIndex` hands out dense ids in order of first sight and keeps every key
tuple it has seen (its tuple, its values and its dict entry: :data:`INDEXED_KEY_BYTES` and the values). :class:`IntKeys`
is the common case of one integer group-by column (a user or device id): each key is its own id,
so a state of a million groups holds no key object at all (docs/decisions.md, "Columnar driver
state"). A state starts with :class:`IntKeys` where it may, and moves to a :class:`KeyIndex` the
first time a batch brings another key (a NULL, a string, a second column).

>>> index = KeyIndex()
>>> index.ids_of([("a",), ("b",), ("a",)]).tolist()
[0, 1, 0]
>>> index.keys_of(np.array([1, 0]))
[('b',), ('a',)]
>>> IntKeys().ids_of([(7,), (-3,)]).tolist(), IntKeys().keys_of(np.array([7]))
([7, -3], [(7,)])
>>> IntKeys().ids_of([(True,)]) is None, IntKeys().ids_of([(None,)]) is None, IntKeys().ids_of([(1, 2)]) is None
(True, True, True)
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Sequence

import numpy as np

from ematix_dagster.streaming.emitted import GroupKey
from ematix_dagster.streaming.kinds.state_columns import I64, ints, run_count
from state_store.int_key_column import IntKeyColumn

#: a key's own cost in a :class:`KeyIndex`, as a state's startup estimate counts it: its dict entry,
#: its tuple and its slot in the key list (the values are ``KEY_VALUE_BYTES`` each, counted apart;
#: measured by ``tests/streaming/test_state_size.py``)
INDEXED_KEY_BYTES = 120


class KeyIndex:
    """Any group keys as dense ints.

    Ids are handed out in order of first sight and kept until :meth:`compacted` drops the keys no
    row holds any more (what a state's eviction asks for once they are most of the index).
    """

    __slots__ = ("ids", "keys", "_grew")

    def __init__(self) -> None:
        self.ids: dict[GroupKey, int] = {}
        self.keys: list[GroupKey] = []
        self._grew = True  # whether the last batch brought a new key

    def __len__(self) -> int:
        return len(self.keys)

    def ids_of(self, keys: Sequence[GroupKey]) -> np.ndarray:
        """The id of each key, new keys getting the next ids. A state whose batches bring no new
        key (sliding windows' steady keys) looks each up once; one whose batches do (sessions of
        keys that come and go) first finds the new ones, as a first lookup would find them only
        to look every key up again."""
        ids = self.ids
        if not self._grew:
            found: list[Any] = list(map(ids.get, keys))
            if None not in found:
                return ints(found, len(keys))
        new = [key for key in dict.fromkeys(keys) if key not in ids]
        ids.update(zip(new, range(len(self.keys), len(self.keys) + len(new))))
        self.keys += new
        self._grew = bool(new)
        return ints(map(ids.__getitem__, keys), len(keys))

    def keys_of(self, kids: np.ndarray) -> list[GroupKey]:
        return list(map(self.keys.__getitem__, kids.tolist()))

    def key_column(self, kids: np.ndarray) -> Sequence[GroupKey]:
        """The keys of ``kids`` for code that hands them on whole (a commit, a report)."""
        return self.keys_of(kids)

    def id_of(self, key: GroupKey) -> int | None:
        """The key's id; None for a key never seen."""
        return self.ids.get(key)

    def compacted(self, columns: list[np.ndarray]) -> list[np.ndarray]:
        """``columns`` of key ids (each sorted) renumbered when the index mostly holds keys no row
        holds any more (an index only grows as keys come); else ``columns`` as they are.
        Renumbering keeps the ids' order, so a sorted column stays sorted."""
        if len(self) <= 2 * sum(map(run_count, columns)) + 1024:
            return columns
        if not columns:
            self.ids, self.keys = {}, []
            return columns
        live, renumbered = np.unique(np.concatenate(columns), return_inverse=True)
        self.keys = self.keys_of(live)
        self.ids = dict(zip(self.keys, range(len(self.keys))))
        bounds = np.cumsum([len(column) for column in columns[:-1]], dtype=I64)
        return np.split(renumbered.reshape(-1).astype(I64, copy=False), bounds)


class IntKeys:
    """Keys of one integer column (not bool), each its own id: no key object is kept."""

    __slots__ = ()

    def __len__(self) -> int:
        return 0

    def ids_of(self, keys: Sequence[GroupKey]) -> np.ndarray | None:
        """The keys' integers; None when a key is not one int64 (the state then moves to a
        :class:`KeyIndex`)."""
        if isinstance(keys, IntKeyColumn):  # a batch's keys straight from Arrow
            return keys.ids
        if set(map(len, keys)) - {1}:  # a key of another width
            return None
        values = list(chain.from_iterable(keys))
        if set(map(type, values)) - {int}:  # bool is an int subclass, but its keys must stay bool
            return None
        try:
            return np.array(values, dtype=I64).reshape(len(values))
        except OverflowError:
            return None

    def keys_of(self, kids: np.ndarray) -> list[GroupKey]:
        return list(zip(kids.tolist()))

    def key_column(self, kids: np.ndarray) -> Sequence[GroupKey]:
        """The keys of ``kids`` as one column, no tuple per key (``state_store.int_key_column``)."""
        return IntKeyColumn(kids)

    def id_of(self, key: GroupKey) -> int | None:
        """The key's id; None for a key this coding cannot hold (none such is held)."""
        ids = self.ids_of([key])
        return None if ids is None else int(ids[0])

    def compacted(self, columns: list[np.ndarray]) -> list[np.ndarray]:
        return columns


#: what a state codes its keys with
KeyCodes = KeyIndex | IntKeys


def coded(codes: KeyCodes, column: np.ndarray, keys: Sequence[GroupKey]) -> tuple[KeyCodes, np.ndarray, np.ndarray]:
    """(codes, column, ids): the ids of ``keys`` for a state holding one key-id column sorted by id
    (sessions, sliding windows). The first key :class:`IntKeys` cannot hold moves every id of
    ``column`` to a :class:`KeyIndex`, whose ids, handed out along the sorted column, keep its order."""
    ids = codes.ids_of(keys)
    if ids is not None:
        return codes, column, ids
    index, (column,) = to_index(codes, [column])
    return index, column, index.ids_of(keys)


def to_index(codes: KeyCodes, columns: Sequence[np.ndarray]) -> tuple[KeyIndex, list[np.ndarray]]:
    """A :class:`KeyIndex` of the keys ``columns`` hold (ids of ``codes``), and the columns in its
    ids: where a state moves the first time a batch brings a key :class:`IntKeys` cannot hold. The
    new ids are in order of first sight, column after column: one sorted column stays sorted, the
    second and later ones may not (the caller sorts them again)."""
    index = KeyIndex()
    return index, [index.ids_of(codes.keys_of(column)) for column in columns]
