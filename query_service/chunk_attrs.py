"""The filterable attributes of the chunks an in-process index holds, kept once per document.

Both in-process indexes (BM25, `sparse_index`; vectors, `dense_index`) test a request's filter
against each candidate's attributes (tenant, collection, source, tags, dates, kind, pages, ...).
A dict per chunk cost about 0.5 KB (16 keys), most of it values every chunk of a document repeats.
`ChunkAttrsTable` keeps, per document, the values its chunks share (a tuple under a name layout
shared by every document with the same names) and, per chunk, a tuple of only the values that
differ between the document's chunks; a filter reads a chunk's attributes through a read-only
`Mapping` view made for the candidates it tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ragrpc.store import schema

_ABSENT: Any = object()  # an attribute one chunk of a document has and another has not
_NO_VALUES: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class _Layout:
    """Attribute names in the order of a values tuple, and where each one is (one per distinct layout)."""

    names: tuple[str, ...]
    positions: dict[str, int]  # read only


@dataclass(frozen=True, slots=True)
class _DocumentAttrs:
    """`shared` / `values`: the attributes every chunk of a document has alike; `varying`: the names
    whose values differ between its chunks (each chunk's own values: `ChunkAttrsTable`)."""

    shared: _Layout
    values: tuple[Any, ...]
    varying: _Layout | None


class ChunkAttrs(Mapping[str, Any]):
    """A chunk's attributes (with its chunk_id), read from its document's and its own values."""

    __slots__ = ("_chunk_id", "_document", "_own")

    def __init__(self, document: _DocumentAttrs, own: tuple[Any, ...], chunk_id: str) -> None:
        self._document = document
        self._own = own
        self._chunk_id = chunk_id

    def get(self, name: str, default: Any = None) -> Any:
        if name == schema.CHUNK_ID:
            return self._chunk_id
        document = self._document
        if document.varying is not None:
            position = document.varying.positions.get(name)
            if position is not None:
                value = self._own[position]
                return default if value is _ABSENT else value
        position = document.shared.positions.get(name)
        return default if position is None else document.values[position]

    def __getitem__(self, name: str) -> Any:
        value = self.get(name, _ABSENT)
        if value is _ABSENT:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        document = self._document
        yield from document.shared.names
        if document.varying is not None:
            yield from (n for n, v in zip(document.varying.names, self._own, strict=True) if v is not _ABSENT)
        yield schema.CHUNK_ID

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ChunkAttrsTable:
    """The attributes of an index's slots (appended a document at a time, in slot order)."""

    def __init__(self) -> None:
        self._documents: list[_DocumentAttrs] = []  # per slot, its document's attributes
        self._own: list[tuple[Any, ...]] = []  # per slot, its own values of its document's `varying`
        self._layouts: dict[tuple[str, ...], _Layout] = {}

    def __len__(self) -> int:
        return len(self._documents)

    def append_document(self, attrs: Sequence[Mapping[str, Any]], **fixed: Any) -> None:
        """The attributes of a document's chunks, in slot order; `fixed` (e.g. tenant, document_id)
        replaces what they say of those names. A chunk's chunk_id is the index's, given to `view`."""
        if not attrs:
            return
        names = sorted({name for chunk in attrs for name in chunk if name not in fixed and name != schema.CHUNK_ID})
        first = attrs[0]
        varying = tuple(
            name for name in names if any(chunk.get(name, _ABSENT) != first.get(name, _ABSENT) for chunk in attrs[1:])
        )
        shared = [name for name in names if name not in varying]
        document = _DocumentAttrs(
            self._layout((*shared, *fixed)),
            (*(first[name] for name in shared), *fixed.values()),
            self._layout(varying) if varying else None,
        )
        self._documents.extend([document] * len(attrs))
        if varying:
            self._own.extend(tuple(chunk.get(name, _ABSENT) for name in varying) for chunk in attrs)
        else:
            self._own.extend([_NO_VALUES] * len(attrs))

    def view(self, slot: int, chunk_id: str) -> ChunkAttrs:
        return ChunkAttrs(self._documents[slot], self._own[slot], chunk_id)

    def keep(self, slots: Iterable[int]) -> None:
        """Only these slots stay, renumbered densely in this order (an index's compaction)."""
        kept = list(slots)
        self._documents = [self._documents[i] for i in kept]
        self._own = [self._own[i] for i in kept]

    def _layout(self, names: tuple[str, ...]) -> _Layout:
        layout = self._layouts.get(names)
        if layout is None:
            layout = self._layouts[names] = _Layout(names, {name: i for i, name in enumerate(names)})
        return layout
