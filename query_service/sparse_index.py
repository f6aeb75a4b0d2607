"""In-process BM25 (Okapi) index with incremental updates: the sparse retriever used when
the store has no server-side BM25 (milvus-lite), or where the query service scores BM25 itself.

Scoring is exactly rank_bm25.BM25Okapi (k1=1.5, b=0.75, epsilon=0.25): for each query term
(repeated terms count again)

    idf(t)  = ln(N - df + 0.5) - ln(df + 0.5), or epsilon * mean idf over the vocabulary
              when negative
    score  += idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avglen))

Statistics scope: ONE SCOPE PER TENANT. N, df, avglen and the mean idf are those of all live
chunks of the tenant (every collection), kept exactly as documents come and go, never per
segment and never across tenants (no tenant's documents influence another tenant's scores).
Narrower restrictions (a collection, documents, sources, tags, ...) are predicates on the
candidates (`allow`), so a collection-restricted search ranks with the tenant's statistics, as
Milvus BM25 does with its collection-wide statistics. Scores can be negative only in tiny corpora
where the mean idf is negative, exactly as in rank_bm25. Equal scores are ordered by chunk id.

Layout per scope (numpy arrays, no Python object per chunk or per posting in the compact part):

  * compact part, built by a compaction, memory-mapped from a snapshot (query_service.index_snapshot)
    and never changed in place: the vocabulary (`StringTable`, term id = row); postings in CSR by
    term (`indptr`, slot ids int32, term frequencies in the narrowest unsigned type); the forward
    index in CSR by slot (each chunk's term ids: what its removal takes off the document
    frequencies); each chunk's length;
  * recent part, the chunks added since: postings per term as array('i') of (slot, tf) pairs, the
    forward index and lengths as flat arrays, terms new to the vocabulary in a dict;
  * exact statistics, kept as chunks come and go: df per term id (array('i')), a histogram of the
    df values (what the mean idf needs, without a pass over the vocabulary), N and the total length.

Chunks' ids, documents and filterable attributes are the scope's `SlotTable` (query_service.slot_table).
Removing a document marks its slots dead and updates the statistics at once. A compaction folds
the recent part and drops dead slots, building new compact arrays off to the side while readers
go on reading the old ones, then swaps them in under the write lock; it runs after a change when
the recent part has grown past max(`merge_min_chunks`, `merge_ratio` x the compact part) or dead
slots outnumber live ones (and at least `compaction_min_dead`), and on `compact()`.

A query touches only its terms' postings: per term, the contributions of its postings are computed
in numpy and summed per slot with one `bincount`, so a query costs what its terms' postings hold,
never a pass per chunk in Python. Asked for its best k, it may skip the full postings of its commonest
terms once the k-th best score so far exceeds what those terms could still add (exact: `_Scope.scores`).

Concurrency: one writer at a time (the index's writer lock) and any number of readers (a
writer-preferring read/write lock); a replacement is atomic for readers.
"""

from __future__ import annotations

import logging
import math
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from query_service.ragged_arrays import StringTable, nest_arrays, sub_arrays, take_rows
from query_service.rw_lock import ReadWriteLock
from query_service.slot_table import GrowableArray, SlotTable
from ragrpc.analyzer import Analyzer

logger = logging.getLogger(__name__)

AttrPredicate = Callable[[Mapping[str, Any]], bool]
FORMAT = 1  # of `export`'s arrays and meta
_MERGE_BLOCK = 1 << 22  # postings a compaction handles at once (bounds its temporary arrays)
_EMPTY_SLOTS = np.zeros(0, dtype=np.int64)


class IndexedChunk(NamedTuple):
    """A chunk to index: its id, text and filterable attributes (schema field -> value); `terms`, when
    given, are the text's terms as the index's analyzer makes them (read from the store), and the text
    is not analysed again."""

    chunk_id: str
    text: str
    attrs: Mapping[str, Any]
    terms: Sequence[str] | None = None


@dataclass(frozen=True)
class Bm25Parameters:
    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25


def _unsigned_type(high: int) -> type:
    """The narrowest unsigned int type that holds 0..high."""
    for kind in (np.uint8, np.uint16, np.uint32):
        if high <= np.iinfo(kind).max:
            return kind
    return np.uint64


def _narrowest_unsigned(values: np.ndarray) -> np.ndarray:
    return values.astype(_unsigned_type(int(values.max()) if len(values) else 0), copy=False)


class _Postings:
    """The compact part of a scope: immutable arrays (see the module docstring)."""

    __slots__ = ("vocabulary", "indptr", "slots", "tfs", "term_starts", "terms", "lengths")

    def __init__(
        self,
        vocabulary: StringTable,
        indptr: np.ndarray,
        slots: np.ndarray,
        tfs: np.ndarray,
        term_starts: np.ndarray,
        terms: np.ndarray,
        lengths: np.ndarray,
    ) -> None:
        self.vocabulary = vocabulary  # term id -> term
        self.indptr = indptr  # term id -> its postings: slots[indptr[t]:indptr[t + 1]], tfs[...]
        self.slots = slots
        self.tfs = tfs
        self.term_starts = term_starts  # slot -> its term ids: terms[term_starts[s]:term_starts[s + 1]]
        self.terms = terms
        self.lengths = lengths  # slot -> its length (terms, repeats counted)

    @classmethod
    def empty(cls) -> _Postings:
        none = np.zeros(0, dtype=np.int32)
        start = np.zeros(1, dtype=np.int64)
        return cls(StringTable.build([], lookup=True), start, none, none.astype(np.uint8), start, none, none)

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        arrays = (self.indptr, self.slots, self.tfs, self.term_starts, self.terms, self.lengths)
        return self.vocabulary.nbytes + sum(a.nbytes for a in arrays)

    def export(self) -> dict[str, np.ndarray]:
        return {
            **nest_arrays("vocabulary", self.vocabulary.export()),
            "indptr": self.indptr,
            "slots": self.slots,
            "tfs": self.tfs,
            "term_starts": self.term_starts,
            "terms": self.terms,
            "lengths": self.lengths,
        }

    @classmethod
    def restore(cls, arrays: Mapping[str, np.ndarray]) -> _Postings:
        postings = cls(
            StringTable.restore(sub_arrays(arrays, "vocabulary")),
            *(arrays[name] for name in ("indptr", "slots", "tfs", "term_starts", "terms", "lengths")),
        )
        postings.check()
        return postings

    def check(self) -> None:
        """What a restore can check without reading the postings themselves (ValueError)."""
        indptr, term_starts = self.indptr, self.term_starts
        if len(indptr) != len(self.vocabulary) + 1 or len(term_starts) != len(self.lengths) + 1:
            raise ValueError("postings offsets do not match the vocabulary or the slots")
        if int(indptr[0]) or int(indptr[-1]) != len(self.slots) or len(self.tfs) != len(self.slots):
            raise ValueError("postings offsets do not span the postings")
        if int(term_starts[0]) or int(term_starts[-1]) != len(self.terms) or len(self.terms) != len(self.slots):
            raise ValueError("forward offsets do not span the forward index")
        if (np.diff(indptr) < 0).any() or (np.diff(term_starts) < 0).any():
            raise ValueError("postings offsets decrease")


class _Part(NamedTuple):
    """Postings of one term in one part of a scope: slots (ascending), their tfs, and the part's per-slot
    lengths (`lengths[slot - offset]`)."""

    slots: np.ndarray
    tfs: np.ndarray
    lengths: np.ndarray
    offset: int


class _QueryTerm(NamedTuple):
    weight: float  # idf x query tf x (k1 + 1): more than the term adds to any chunk's score
    parts: list[_Part]
    postings: int


def _contributions(
    weight: float, part: _Part, slots: np.ndarray, tfs: np.ndarray, length_norm: tuple[float, float]
) -> np.ndarray:
    """What the term adds to each of `slots` (with term frequencies `tfs`): rank_bm25's formula."""
    base, per_length = length_norm
    lengths = part.lengths.take(slots - part.offset if part.offset else slots)
    tf = tfs.astype(np.float64)
    return weight * tf / (tf + (base + per_length * lengths))


def _add_where_present(
    scores: np.ndarray, candidates: np.ndarray, weight: float, part: _Part, length_norm: tuple[float, float]
) -> None:
    """Add the term's contributions to the candidates its postings hold (binary search, not a scan)."""
    if not len(candidates):
        return
    positions = np.minimum(np.searchsorted(part.slots, candidates), len(part.slots) - 1)
    present = part.slots[positions] == candidates
    if present.any():
        found = positions[present]
        scores[present] += _contributions(weight, part, part.slots[found], part.tfs[found], length_norm)


class _Allowed:
    """An `allow` predicate asked once per slot of a search (pruning and the final walk ask the same slots)."""

    def __init__(self, slots: SlotTable, allow: AttrPredicate) -> None:
        self._slots = slots
        self._allow = allow
        self._answers: dict[int, bool] = {}

    def __call__(self, slot: int) -> bool:
        answer = self._answers.get(slot)
        if answer is None:
            answer = self._answers[slot] = bool(self._allow(self._slots.view(slot)))
        return answer


class _Merged(NamedTuple):
    postings: _Postings
    slots: SlotTable
    df: np.ndarray
    ids_kept: bool  # term ids are those of before (no term was dropped)


class _Scope:
    """Index and statistics of one tenant. Not locked itself; the index locks."""

    def __init__(self, tenant: str, postings: _Postings | None = None, slots: SlotTable | None = None) -> None:
        self.postings = postings or _Postings.empty()
        self.slots = slots or SlotTable(tenant)
        if self.slots.compact_size != self.postings.size:
            raise ValueError("postings and slot table disagree on the number of slots")
        df = np.diff(self.postings.indptr).astype(np.int32)
        self.df = array("i", df.tobytes())  # by term id: compact terms, then new ones
        values, counts = np.unique(df[df > 0], return_counts=True)
        self.df_histogram: Counter[int] = Counter(dict(zip(values.tolist(), counts.tolist(), strict=True)))
        self.live_length = int(self.postings.lengths.sum(dtype=np.int64))
        self.term_cache: dict[str, int] = {}  # compact terms met since the last compaction
        self._scratch = threading.local()  # each reader thread's mask of touched slots
        self.version = 0
        self._mean_idf_cache: tuple[int, float] = (-1, 0.0)
        self._reset_recent()

    def _reset_recent(self) -> None:
        self.new_terms: dict[str, int] = {}  # terms not in the compact vocabulary -> id
        self.new_term_list: list[str] = []
        self.recent_postings: dict[int, array] = {}  # term id -> (slot, tf) pairs of recent slots
        self.recent_lengths = GrowableArray(np.int32)
        self.recent_terms = array("i")  # term ids of each recent slot, concatenated
        self.recent_term_ends = array("q")  # per recent slot, where its term ids end

    # --- writes ----------------------------------------------------------------------
    def add(self, document_id: str, chunks: Sequence[IndexedChunk], frequencies: Sequence[Counter[str]]) -> None:
        first = self.slots.append(document_id, [c.chunk_id for c in chunks], [c.attrs for c in chunks])
        ids = self._ids_for_add({term for counts in frequencies for term in counts})
        postings, terms, ends = self.recent_postings, self.recent_terms, self.recent_term_ends
        added: Counter[int] = Counter()
        for slot, counts in enumerate(frequencies, first):
            term_ids = [ids[term] for term in counts]
            for term_id, tf in zip(term_ids, counts.values(), strict=True):
                pairs = postings.get(term_id)
                if pairs is None:
                    pairs = postings[term_id] = array("i")
                pairs.extend((slot, tf))
            terms.extend(term_ids)
            added.update(term_ids)
            ends.append(len(terms))
            length = sum(counts.values())
            self.recent_lengths.append(length)
            self.live_length += length
        self._change_df(added)
        self.version += 1

    def _ids_for_add(self, terms: set[str]) -> dict[str, int]:
        """Each term's id, new terms given one (with a df of 0)."""
        ids: dict[str, int] = {}
        missing: list[str] = []
        for term in terms:
            term_id = self.new_terms.get(term)
            if term_id is None:
                term_id = self.term_cache.get(term)
            if term_id is None:
                missing.append(term)
            else:
                ids[term] = term_id
        if missing and len(self.postings.vocabulary):
            rows = self.postings.vocabulary.find_many([term.encode() for term in missing]).tolist()
            for term, row in zip(missing, rows, strict=True):
                if row >= 0:
                    ids[term] = self.term_cache[term] = row
            missing = [term for term, row in zip(missing, rows, strict=True) if row < 0]
        for term in missing:
            ids[term] = self.new_terms[term] = len(self.df)
            self.new_term_list.append(term)
            self.df.append(0)
        return ids

    def remove(self, document_id: str) -> bool:
        found = self.slots.remove(document_id)
        if found is None:
            return False
        first, count = found
        compact = self.postings
        if first < compact.size:  # a document's slots are all compact or all recent
            terms = compact.terms[int(compact.term_starts[first]) : int(compact.term_starts[first + count])]
            length = int(compact.lengths[first : first + count].sum(dtype=np.int64))
        else:
            row = first - compact.size
            ends = self.recent_term_ends
            start = ends[row - 1] if row else 0
            stop = ends[row + count - 1] if count else start
            terms = np.array(self.recent_terms[start:stop], dtype=np.int32)
            length = int(self.recent_lengths.data[row : row + count].sum(dtype=np.int64))
        term_ids, counts = np.unique(terms, return_counts=True)
        self._change_df(dict(zip(term_ids.tolist(), (-counts).tolist(), strict=True)))
        self.live_length -= length
        self.version += 1
        return True

    def _change_df(self, deltas: Mapping[int, int]) -> None:
        """Apply per-term-id document-frequency changes (and to the histogram of df values)."""
        df, histogram = self.df, self.df_histogram
        for term_id, delta in deltas.items():
            old = df[term_id]
            new = old + delta
            if old:
                if histogram[old] == 1:
                    del histogram[old]
                else:
                    histogram[old] -= 1
            if new:
                histogram[new] += 1
            df[term_id] = new

    # --- compaction --------------------------------------------------------------------
    def merge(self) -> _Merged:
        """The compact part this scope's live slots make (nothing here is changed: `install` it)."""
        compact = self.postings
        keep = self.slots.live()
        new_slot = np.full(self.slots.size, -1, dtype=np.int64)
        new_slot[keep] = np.arange(len(keep))
        keep_compact = keep[keep < compact.size]
        keep_recent = keep[keep >= compact.size] - compact.size
        df = np.array(self.df, dtype=np.int32)
        live_terms = df > 0
        dropped = len(df) - int(live_terms.sum())
        ids_kept = dropped <= max(1024, len(df) - dropped)  # dead terms are dropped once they outnumber live ones
        kept_terms = np.arange(len(df)) if ids_kept else np.flatnonzero(live_terms)
        term_map = np.full(len(df), -1, dtype=np.int64)
        term_map[kept_terms] = np.arange(len(kept_terms))

        # forward index of the kept slots
        forward_compact, starts_compact = take_rows(compact.terms, compact.term_starts, keep_compact)
        recent_starts = np.zeros(len(self.recent_term_ends) + 1, dtype=np.int64)
        recent_starts[1:] = np.array(self.recent_term_ends, dtype=np.int64)
        recent_terms = np.array(self.recent_terms, dtype=np.int32)
        forward_recent, starts_recent = take_rows(recent_terms, recent_starts, keep_recent)
        terms = term_map[np.concatenate((forward_compact, forward_recent))].astype(np.int32)
        term_starts = np.concatenate((starts_compact, starts_compact[-1] + starts_recent[1:]))

        # postings: per term, the kept compact postings, then the kept recent ones (slots ascending)
        old_compact_counts = np.bincount(forward_compact, minlength=len(compact.vocabulary))
        compact_counts = np.zeros(len(kept_terms), dtype=np.int64)
        mapped = term_map[: len(old_compact_counts)]
        compact_counts[mapped[mapped >= 0]] = old_compact_counts[mapped >= 0]
        recent_term, recent_slot, recent_tf = self._recent_arrays(new_slot, term_map)
        recent_counts = np.bincount(recent_term, minlength=len(kept_terms))
        indptr = np.zeros(len(kept_terms) + 1, dtype=np.int64)
        np.cumsum(compact_counts + recent_counts, out=indptr[1:])
        tf_high = max(int(recent_tf.max()) if len(recent_tf) else 0, int(np.iinfo(compact.tfs.dtype).max))
        tf_type = _unsigned_type(tf_high)
        slots = np.empty(int(indptr[-1]), dtype=np.int32)
        tfs: np.ndarray = np.empty(int(indptr[-1]), dtype=tf_type)
        self._place_compact(slots, tfs, indptr, old_compact_counts, new_slot, mapped)
        recent_starts_by_term = np.concatenate(([0], np.cumsum(recent_counts)[:-1]))
        rank = np.arange(len(recent_term)) - recent_starts_by_term[recent_term]
        destination = indptr[recent_term] + compact_counts[recent_term] + rank
        slots[destination] = recent_slot
        tfs[destination] = recent_tf

        lengths = np.concatenate(
            (compact.lengths[keep_compact].astype(np.int64), self.recent_lengths.view()[keep_recent].astype(np.int64))
        )
        new_terms = [term.encode() for term in self.new_term_list]
        compact_rows = kept_terms[kept_terms < len(compact.vocabulary)]
        added = [new_terms[i - len(compact.vocabulary)] for i in kept_terms[len(compact_rows) :].tolist()]
        vocabulary = StringTable.combine(compact.vocabulary, compact_rows, added, lookup=True)
        postings = _Postings(vocabulary, indptr, slots, tfs, term_starts, terms, _narrowest_unsigned(lengths))
        return _Merged(postings, self.slots.merged(keep), df[kept_terms], ids_kept)

    def _recent_arrays(self, new_slot: np.ndarray, term_map: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The recent postings of live slots as (new term id, new slot, tf), sorted by term then slot."""
        term_ids = list(self.recent_postings)
        if not term_ids:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        parts = [np.array(self.recent_postings[t], dtype=np.int32) for t in term_ids]
        pairs = np.concatenate(parts).reshape(-1, 2)
        terms = np.repeat(np.asarray(term_ids, dtype=np.int64), [len(p) // 2 for p in parts])
        slots = new_slot[pairs[:, 0]]
        live = slots >= 0
        terms, slots, tfs = term_map[terms[live]], slots[live], pairs[live, 1].astype(np.int64)
        order = np.argsort(terms, kind="stable")  # a term's recent postings are in slot order already
        return terms[order], slots[order], tfs[order]

    def _place_compact(
        self,
        slots: np.ndarray,
        tfs: np.ndarray,
        indptr: np.ndarray,
        live_counts: np.ndarray,
        new_slot: np.ndarray,
        term_map: np.ndarray,
    ) -> None:
        """Copy the compact postings of live slots to their new places, a block of terms at a time."""
        compact = self.postings
        old_indptr = compact.indptr
        first = 0
        while first < len(live_counts):
            limit = int(old_indptr[first]) + _MERGE_BLOCK
            last = max(first + 1, min(len(live_counts), int(np.searchsorted(old_indptr, limit, side="right")) - 1))
            start, stop = int(old_indptr[first]), int(old_indptr[last])
            renumbered = new_slot[compact.slots[start:stop]]
            live = renumbered >= 0
            counts = live_counts[first:last]
            within = np.concatenate(([0], np.cumsum(counts)[:-1]))
            targets = indptr[np.maximum(term_map[first:last], 0)]
            destination = np.repeat(targets - within, counts) + np.arange(int(counts.sum()))
            slots[destination] = renumbered[live]
            tfs[destination] = compact.tfs[start:stop][live]
            first = last

    def install(self, merged: _Merged) -> None:
        """Make a merge's result the scope's compact part (under the write lock)."""
        self.postings, self.slots = merged.postings, merged.slots
        self.df = array("i", merged.df.astype(np.int32).tobytes())
        if merged.ids_kept:
            self.term_cache.update(self.new_terms)
        else:
            self.term_cache = {}
        self._reset_recent()
        self.version += 1

    # --- reads -------------------------------------------------------------------------
    def term_id(self, term: str) -> int:
        """The term's id, or -1 when no chunk of the scope ever had it since the last compaction."""
        term_id = self.new_terms.get(term)
        if term_id is None:
            term_id = self.term_cache.get(term)
        if term_id is None:
            vocabulary = self.postings.vocabulary
            term_id = vocabulary.find(term.encode()) if len(vocabulary) else -1
            if term_id >= 0:
                self.term_cache[term] = term_id  # benign race: readers store equal values
        return term_id

    def mean_idf(self) -> float:
        version, value = self._mean_idf_cache
        if version == self.version:
            return value
        histogram = self.df_histogram
        dfs = np.fromiter(histogram.keys(), dtype=np.float64, count=len(histogram))
        counts = np.fromiter(histogram.values(), dtype=np.float64, count=len(histogram))
        idf = np.log(self.slots.live_slots - dfs + 0.5) - np.log(dfs + 0.5)
        value = float((counts * idf).sum() / counts.sum()) if len(counts) else 0.0
        self._mean_idf_cache = (self.version, value)  # benign race: readers store equal values
        return value

    def idf(self, df: int, floor: float) -> float:
        """A term's idf from its document frequency (> 0)."""
        value = math.log(self.slots.live_slots - df + 0.5) - math.log(df + 0.5)
        return floor if value < 0 else value

    def _term_postings(self, term_id: int) -> Iterator[_Part]:
        """The term's postings: compact, then recent (each in slot order)."""
        compact = self.postings
        if term_id < len(compact.vocabulary):
            start, stop = int(compact.indptr[term_id]), int(compact.indptr[term_id + 1])
            if stop > start:
                yield _Part(compact.slots[start:stop], compact.tfs[start:stop], compact.lengths, 0)
        pairs = self.recent_postings.get(term_id)
        if pairs:
            recent = np.array(pairs, dtype=np.int32).reshape(-1, 2)
            yield _Part(recent[:, 0], recent[:, 1], self.recent_lengths.data, compact.size)

    def _plan(self, query_terms: Counter[str], params: Bm25Parameters) -> list[_QueryTerm]:
        """The query's terms that some live chunk has, by weight (idf x query tf x (k1 + 1)), highest first."""
        floor = params.epsilon * self.mean_idf()
        terms = []
        for term, query_tf in query_terms.items():
            term_id = self.term_id(term)
            df = self.df[term_id] if term_id >= 0 else 0
            if df > 0:
                parts = list(self._term_postings(term_id))
                weight = query_tf * self.idf(df, floor) * (params.k1 + 1)
                terms.append(_QueryTerm(weight, parts, sum(len(p.slots) for p in parts)))
        return sorted(terms, key=lambda t: -t.weight)

    def scores(
        self,
        query_terms: Counter[str],
        params: Bm25Parameters,
        *,
        top_k: int = 0,
        allowed: _Allowed | None = None,
        within: np.ndarray | None = None,
        prune_min_postings: int = 0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(candidate slots, their scores): live slots (of `within`, when given) containing at least one
        query term; with `top_k`, possibly only those that can be among the best `top_k` passing `allowed`.

        That pruning is exact (MaxScore): terms are scored in order of weight, and before the postings of
        the remaining terms (at least `prune_min_postings` of them, and twice those scored so far) are
        scored in full, the k-th best score so far among allowed chunks is a lower bound of the k-th best
        final score, while a chunk holding none of the terms scored so far scores less than the sum of the
        remaining terms' weights (each term adds less than its weight). When that sum is below the bound,
        the remaining terms only add to the chunks already found (a binary search in their postings)."""
        terms = self._plan(query_terms, params)
        if not terms:
            return _EMPTY_SLOTS, np.zeros(0, dtype=np.float64)
        length_norm = (params.k1 * (1 - params.b), params.k1 * params.b * self.slots.live_slots / self.live_length)
        positive = all(t.weight > 0 for t in terms)
        remaining_weight = np.cumsum([t.weight for t in terms][::-1])[::-1].tolist()
        remaining_postings = np.cumsum([t.postings for t in terms][::-1])[::-1].tolist()
        slot_parts: list[np.ndarray] = []
        score_parts: list[np.ndarray] = []
        essential, scored, tests = len(terms), 0, 0
        for number, term in enumerate(terms):
            worth = remaining_postings[number] >= max(prune_min_postings, 2 * scored) and tests < 2
            if positive and top_k and number and worth:
                tests += 1
                bound = self._kth_best(slot_parts, score_parts, top_k, allowed, within)
                if bound is not None and remaining_weight[number] < bound:
                    essential = number
                    break
            for part in term.parts:
                slot_parts.append(part.slots)
                score_parts.append(_contributions(term.weight, part, part.slots, part.tfs, length_norm))
            scored += term.postings
        candidates, scores = self._totals(slot_parts, score_parts, within)
        for term in terms[essential:]:
            for part in term.parts:
                _add_where_present(scores, candidates, term.weight, part, length_norm)
        return candidates, scores

    def _totals(
        self, slot_parts: list[np.ndarray], score_parts: list[np.ndarray], within: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The live (and `within`) slots the parts hold, with their summed scores."""
        if not slot_parts:
            return _EMPTY_SLOTS, np.zeros(0, dtype=np.float64)
        slots, weights = np.concatenate(slot_parts), np.concatenate(score_parts)
        size = self.slots.size
        if len(slots) * 16 < size:  # few postings: sort them rather than sum into an array of every slot
            candidates, inverse = np.unique(slots, return_inverse=True)
            scores = np.bincount(inverse, weights=weights, minlength=len(candidates))
        else:
            totals = np.bincount(slots, weights=weights, minlength=size)
            candidates = self._touched(slots, size)
            scores = totals[candidates]
        keep = None
        if self.slots.dead_slots:
            keep = self.slots.alive.data[candidates]
        if within is not None:
            inside = np.isin(candidates, within)
            keep = inside if keep is None else keep & inside
        return (candidates, scores) if keep is None else (candidates[keep], scores[keep])

    def _touched(self, slots: np.ndarray, size: int) -> np.ndarray:
        """The distinct `slots`, ascending, by marking them in this thread's reused mask of every slot (a
        scan of one byte a slot whose pages stay mapped, where a fresh array's pages fault in anew)."""
        mask = getattr(self._scratch, "mask", None)
        if mask is None or len(mask) < size:
            mask = self._scratch.mask = np.zeros(max(size, 1024) * 5 // 4, dtype=np.bool_)
        try:
            mask[slots] = True
            return np.flatnonzero(mask[:size])
        finally:
            mask[slots] = False

    def _kth_best(
        self,
        slot_parts: list[np.ndarray],
        score_parts: list[np.ndarray],
        top_k: int,
        allowed: _Allowed | None,
        within: np.ndarray | None,
    ) -> float | None:
        """The k-th best score of the parts among allowed slots (None: fewer than k)."""
        candidates, scores = self._totals(slot_parts, score_parts, within)
        if len(candidates) < top_k:
            return None
        picked = _top_allowed(self.slots, candidates, scores, top_k, allowed)
        return picked[top_k - 1][1] if len(picked) >= top_k else None

    @property
    def nbytes(self) -> int:
        recent = sum(len(p) * 4 for p in self.recent_postings.values()) + len(self.recent_terms) * 4
        return self.postings.nbytes + self.slots.nbytes + len(self.df) * 4 + recent + self.recent_lengths.data.nbytes

    # --- snapshot ----------------------------------------------------------------------
    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        slots_meta, slots_arrays = self.slots.export()
        if self.slots.recent_size or self.new_terms:
            raise ValueError("export of a BM25 scope that is not compacted")
        return {"slots": slots_meta}, {
            **nest_arrays("postings", self.postings.export()),
            **nest_arrays("slots", slots_arrays),
        }

    @classmethod
    def restore(cls, tenant: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> _Scope:
        slots = SlotTable.restore(meta["slots"], sub_arrays(arrays, "slots"))
        if slots.tenant != tenant:
            raise ValueError(f"scope of {tenant!r} holds the slots of {slots.tenant!r}")
        return cls(tenant, _Postings.restore(sub_arrays(arrays, "postings")), slots)


class InProcessBm25Index:
    """BM25 over chunks kept in memory, per-tenant statistics, incremental updates.

    Documents are keyed by (tenant, document_id). `allow` predicates (e.g.
    `filter_from_request(...).matches`) read each candidate's attributes with tenant,
    document_id and chunk_id.
    """

    def __init__(
        self,
        analyzer: Analyzer,
        params: Bm25Parameters = Bm25Parameters(),
        *,
        compaction_min_dead: int = 1024,
        merge_min_chunks: int = 16384,
        merge_ratio: float = 0.25,
        prune_min_postings: int = 20000,
    ) -> None:
        self._analyzer = analyzer
        self._params = params
        self._prune_min_postings = prune_min_postings
        self._compaction_min_dead = compaction_min_dead
        self._merge_min_chunks = merge_min_chunks
        self._merge_ratio = merge_ratio
        self._scopes: dict[str, _Scope] = {}
        self._lock = ReadWriteLock()
        self._writer = threading.Lock()  # one change (and the compaction it triggers) at a time

    @property
    def params(self) -> Bm25Parameters:
        return self._params

    # --- changes -----------------------------------------------------------------------
    def add_document(self, tenant: str, document_id: str, chunks: Sequence[IndexedChunk | tuple]) -> None:
        """Index a new document; ValueError if (tenant, document_id) is already indexed."""
        prepared, frequencies = self._prepare(chunks)
        with self._writer:
            scope = self._scopes.get(tenant)
            if scope is not None and scope.slots.find(document_id) is not None:
                raise ValueError(f"document {tenant}/{document_id} is already indexed")
            with self._lock.write():
                scope = self._scope(tenant)
                scope.add(document_id, prepared, frequencies)
            self._compact_if_due(scope)

    def remove_document(self, tenant: str, document_id: str) -> bool:
        """Remove a document; False when it was not indexed."""
        with self._writer:
            scope = self._scopes.get(tenant)
            if scope is None:
                return False
            with self._lock.write():
                removed = scope.remove(document_id)
                if not scope.slots.live_documents:
                    del self._scopes[tenant]
                    return removed
            self._compact_if_due(scope)
            return removed

    def replace_document(self, tenant: str, document_id: str, chunks: Sequence[IndexedChunk | tuple]) -> None:
        """Atomically replace (or add) a document: readers see the old or the new chunks."""
        prepared, frequencies = self._prepare(chunks)
        with self._writer:
            with self._lock.write():
                scope = self._scope(tenant)
                scope.remove(document_id)
                scope.add(document_id, prepared, frequencies)
            self._compact_if_due(scope)

    def _scope(self, tenant: str) -> _Scope:
        """The tenant's scope, made when it has none (under the write lock)."""
        scope = self._scopes.get(tenant)
        if scope is None:
            scope = self._scopes[tenant] = _Scope(tenant)
        return scope

    def compact(self) -> None:
        """Fold every scope's recent part into its compact part and drop dead slots now (what a
        change does by itself past the thresholds); for the index sync after a load, and snapshots."""
        with self._writer:
            for scope in list(self._scopes.values()):
                if scope.slots.recent_size or scope.slots.dead_slots or scope.new_terms:
                    self._install(scope, scope.merge())

    def trim(self) -> None:
        """Gives back the room the recent parts grew into (after the start-up load): `compact`."""
        self.compact()

    def _compact_if_due(self, scope: _Scope) -> None:
        slots = scope.slots
        dead_due = slots.dead_slots >= max(self._compaction_min_dead, slots.live_slots)
        recent_due = slots.recent_size >= max(self._merge_min_chunks, self._merge_ratio * slots.compact_size)
        if dead_due or recent_due:
            self._install(scope, scope.merge())

    def _install(self, scope: _Scope, merged: _Merged) -> None:
        with self._lock.write():
            scope.install(merged)

    def _prepare(self, chunks: Sequence[IndexedChunk | tuple]) -> tuple[list[IndexedChunk], list[Counter[str]]]:
        """Analyse outside the locks: the chunks and each one's term frequencies."""
        prepared = [IndexedChunk(*chunk) for chunk in chunks]
        return prepared, [Counter(self._terms(chunk)) for chunk in prepared]

    def _terms(self, chunk: IndexedChunk) -> Sequence[str]:
        return chunk.terms if chunk.terms is not None else self._analyzer.analyze(chunk.text)

    # --- reads -------------------------------------------------------------------------
    def search(
        self,
        query: str,
        top_k: int,
        *,
        tenant: str,
        allow: AttrPredicate | None = None,
        document_ids: Collection[str] | None = None,
    ) -> list[tuple[str, float]]:
        """Best `top_k` (chunk_id, score) of the tenant's chunks passing `allow`, best first.

        Only chunks containing at least one query term are candidates; ties are broken by
        chunk_id. `document_ids` restricts the candidates cheaply before `allow` runs (use it
        for selective document filters: `allow` is called per candidate in score order).
        """
        if top_k <= 0:
            return []
        query_terms = Counter(self._analyzer.analyze(query))
        if not query_terms:
            return []
        with self._lock.read():
            scope = self._scopes.get(tenant)
            if scope is None or not scope.slots.live_slots or not scope.live_length:
                return []
            allowed = _Allowed(scope.slots, allow) if allow is not None else None
            within = scope.slots.slots_of(document_ids) if document_ids is not None else None
            slots, scores = scope.scores(
                query_terms,
                self._params,
                top_k=top_k,
                allowed=allowed,
                within=within,
                prune_min_postings=self._prune_min_postings,
            )
            return _top_allowed(scope.slots, slots, scores, top_k, allowed)

    def document_count(self, tenant: str) -> int:
        with self._lock.read():
            scope = self._scopes.get(tenant)
            return scope.slots.live_documents if scope else 0

    def chunk_count(self, tenant: str) -> int:
        with self._lock.read():
            scope = self._scopes.get(tenant)
            return scope.slots.live_slots if scope else 0

    def memory_bytes(self) -> int:
        """Bytes of the index's arrays (memory-mapped ones included) and an estimate of its recent parts."""
        with self._lock.read():
            return sum(scope.nbytes for scope in self._scopes.values())

    # --- snapshot ----------------------------------------------------------------------
    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of the whole index, compacted first: what query_service.index_snapshot writes.
        The arrays are never changed afterwards (a later compaction makes new ones), so they can be
        written while the index goes on changing."""
        with self._writer:
            for scope in list(self._scopes.values()):
                if scope.slots.recent_size or scope.slots.dead_slots or scope.new_terms:
                    self._install(scope, scope.merge())
            meta: dict[str, Any] = {"format": FORMAT, "params": asdict(self._params), "scopes": []}
            arrays: dict[str, np.ndarray] = {}
            for number, (tenant, scope) in enumerate(self._scopes.items()):
                scope_meta, scope_arrays = scope.export()
                meta["scopes"].append({"tenant": tenant, **scope_meta})
                arrays.update(nest_arrays(f"s{number}", scope_arrays))
            return meta, arrays

    def adopt(self, other: InProcessBm25Index) -> None:
        """Takes over the contents of `other` (an index restored from a snapshot that another process built),
        so that everything holding this index searches and changes them; `other` must not be used afterwards.
        ValueError when its BM25 parameters are not this index's."""
        if other._params != self._params:
            raise ValueError(f"BM25 parameters {other._params} cannot replace {self._params}")
        with self._writer, self._lock.write():
            self._scopes = other._scopes
            other._scopes = {}

    @classmethod
    def restore(
        cls, analyzer: Analyzer, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], **options: Any
    ) -> InProcessBm25Index:
        """An index over exported arrays (memory-mapped ones are read in place, never copied whole);
        ValueError when they are not a consistent export of this format."""
        if meta.get("format") != FORMAT:
            raise ValueError(f"BM25 index format {meta.get('format')!r}, expected {FORMAT}")
        index = cls(analyzer, Bm25Parameters(**meta["params"]), **options)
        for number, scope_meta in enumerate(meta["scopes"]):
            tenant = str(scope_meta["tenant"])
            index._scopes[tenant] = _Scope.restore(tenant, scope_meta, sub_arrays(arrays, f"s{number}"))
        return index


def _top_allowed(
    slot_table: SlotTable, slots: np.ndarray, scores: np.ndarray, top_k: int, allowed: _Allowed | None
) -> list[tuple[str, float]]:
    """Walk candidates by descending score until top_k allowed ones and all their ties are seen."""
    picked: list[tuple[str, float]] = []
    for index in _descending(scores, top_k):
        score = float(scores[index])
        if len(picked) >= top_k and score < picked[top_k - 1][1]:
            break
        slot = int(slots[index])
        if allowed is None or allowed(slot):
            picked.append((slot_table.chunk_id(slot), score))
    picked.sort(key=lambda hit: (-hit[1], hit[0]))
    return picked[:top_k]


def _descending(scores: np.ndarray, top_k: int) -> Iterator[int]:
    """Indices of `scores` from highest to lowest, sorting a growing head at a time.

    Every index outside a head scores <= every index in it, so yielding each head's new
    indices in order gives a non-increasing sequence without sorting all candidates.
    """
    yielded = np.zeros(len(scores), dtype=np.bool_)
    head_size = max(4 * top_k, 64)
    while True:
        if head_size >= len(scores):
            head = np.argsort(-scores, kind="stable")
        else:
            head = np.argpartition(-scores, head_size - 1)[:head_size]
            head = head[np.argsort(-scores[head], kind="stable")]
        fresh = head[~yielded[head]]
        yielded[fresh] = True
        yield from fresh.tolist()
        if head_size >= len(scores):
            return
        head_size *= 4
