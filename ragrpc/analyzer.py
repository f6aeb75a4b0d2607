"""Text analysis for BM25 (the in-process rank_bm25 index, and what the Milvus BM25 function indexes in
collections of schema 2, ragrpc.store.bm25_text): text -> list of index terms.

EnglishAnalyzer: NFKC normalisation, lowercasing, unicode word tokens (letters and digits;
underscores split words, so `snake_case` gives `snake`, `case`), English stop-word removal,
Snowball English stemming (PyStemmer). Query and documents must use the same analyzer.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Iterable
from typing import Protocol

import Stemmer

logger = logging.getLogger(__name__)

# The classic English stop-word list (NLTK's list, which includes contraction fragments
# such as "don" and "t" that \w tokenisation produces from "don't").
ENGLISH_STOP_WORDS: frozenset[str] = frozenset(
    """
a about above after again against ain all am an and any are aren aren't as at be because
been before being below between both but by can couldn couldn't d did didn didn't do does
doesn doesn't doing don don't down during each few for from further had hadn hadn't has
hasn hasn't have haven haven't having he her here hers herself him himself his how i if
in into is isn isn't it it's its itself just ll m ma me mightn mightn't more most mustn
mustn't my myself needn needn't no nor not now o of off on once only or other our ours
ourselves out over own re s same shan shan't she she's should should've shouldn shouldn't
so some such t than that that'll the their theirs them themselves then there these they
this those through to too under until up ve very was wasn wasn't we were weren weren't
what when where which while who whom why will with won won't wouldn wouldn't y you you'd
you'll you're you've your yours yourself yourselves
""".split()
)

_WORD = re.compile(r"[^\W_]+")


class Analyzer(Protocol):
    """Turns text into index terms."""

    def analyze(self, text: str) -> list[str]: ...


class EnglishAnalyzer:
    """Lowercase unicode word tokens, English stop words removed, Snowball-stemmed.

    Thread-safe: PyStemmer stemmers keep internal state, so each thread gets its own.
    Tokens longer than max_token_length characters (hashes, base64 blobs) are dropped.
    """

    def __init__(
        self,
        stop_words: Iterable[str] = ENGLISH_STOP_WORDS,
        *,
        max_token_length: int = 64,
        stemmer_cache_size: int = 10000,
    ) -> None:
        self._stop_words = frozenset(word.lower() for word in stop_words)
        self._max_token_length = max_token_length
        self._stemmer_cache_size = stemmer_cache_size
        self._local = threading.local()

    def tokenize(self, text: str) -> list[str]:
        """Lowercase word tokens with stop words removed (not stemmed)."""
        if not text.isascii():
            text = unicodedata.normalize("NFKC", text)
        stop_words, max_length = self._stop_words, self._max_token_length
        tokens = _WORD.findall(text.lower())
        return [token for token in tokens if token not in stop_words and len(token) <= max_length]

    def analyze(self, text: str) -> list[str]:
        """Index terms of `text`, in order (duplicates kept)."""
        tokens = self.tokenize(text)
        return self._stemmer().stemWords(tokens) if tokens else []

    def _stemmer(self) -> Stemmer.Stemmer:
        stemmer = getattr(self._local, "stemmer", None)
        if stemmer is None:
            stemmer = Stemmer.Stemmer("english", self._stemmer_cache_size)
            self._local.stemmer = stemmer
        return stemmer
