"""Cross-document micro-batching of embeddings.

Documents are small and many (an abstract is one or two chunks), but the model is fastest
on full batches, and its calls must not outnumber its streams. Every concurrent
ingestion submits its texts here; a worker embeds them in batches of up to
`batch_size` texts, waiting at most `max_wait_s` for a batch to fill, so extraction,
chunking and writing of other documents overlap with embedding. With `concurrency` > 1 that
many calls are in flight at once (for an embedder that runs several model streams, so they
never wait for the next call to be gathered and handed over).

A model call shared by several documents that the model refuses (an embeddings endpoint that
answers HTTP 400 for one text: too long, unsafe, malformed) does not fail every document in it:
each text is then embedded alone, and only the documents with a refused text fail, with that
text's error. An outage (UnavailableError) fails the whole call, as retrying alone cannot help.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ragrpc import errors

logger = logging.getLogger(__name__)

EmbedFunction = Callable[[list[str]], np.ndarray]


@dataclass
class _Request:
    texts: list[str]
    future: asyncio.Future[np.ndarray]


def _fail_all(requests: list[_Request], exc: BaseException) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(exc)


def _refused_text(exc: BaseException, position: int) -> BaseException:
    """The error of a refused text, saying which chunk of the document it was."""
    if isinstance(exc, errors.RagrpcError):
        return type(exc)(
            f"chunk {position} of the document was refused by the embedding model: {exc.message}",
            reason=exc.reason,
            metadata={**exc.metadata, "chunk_index": str(position)},
        )
    return exc


class EmbeddingBatcher:
    """`await batcher.embed(texts)` -> vectors; up to `concurrency` model calls at a time, batched across callers."""

    def __init__(
        self, embed: EmbedFunction, *, batch_size: int = 64, max_wait_s: float = 0.02, concurrency: int = 1
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._embed = embed
        self._batch_size = batch_size
        self._max_wait_s = max_wait_s
        self._concurrency = concurrency
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="embed")
        self.batches = 0  # model calls so far (for benchmarks and tests)
        self.most_in_flight = 0  # most model calls seen running at once (for tests)

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        self._ensure_worker()
        assert self._queue is not None
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(list(texts), future))
        return await future

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run())

    async def _collect(self) -> list[_Request]:
        assert self._queue is not None
        batch = [await self._queue.get()]
        size = len(batch[0].texts)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_wait_s
        while size < self._batch_size:
            try:  # what is queued already is taken as it is (a wait_for costs a task and a timer)
                request = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    request = await asyncio.wait_for(self._queue.get(), left)
                except TimeoutError:
                    break
            batch.append(request)
            size += len(request.texts)
        return batch

    async def _run(self) -> None:
        slots = asyncio.Semaphore(self._concurrency)
        loop = asyncio.get_running_loop()
        while True:
            await slots.acquire()  # gather the next call only when it can start: it fills meanwhile
            try:
                batch = await self._collect()
            except BaseException:
                slots.release()
                raise
            task = loop.create_task(self._call(batch))
            self._calls.add(task)
            self.most_in_flight = max(self.most_in_flight, len(self._calls))
            task.add_done_callback(self._calls.discard)
            task.add_done_callback(lambda _: slots.release())

    async def _call(self, batch: list[_Request]) -> None:
        live = [r for r in batch if not r.future.cancelled()]
        texts = [t for r in live for t in r.texts]
        if not texts:
            return
        loop = asyncio.get_running_loop()
        try:
            vectors = await loop.run_in_executor(self._executor, self._embed, texts)
        except errors.UnavailableError as exc:  # the model or endpoint is down: every caller fails alike
            _fail_all(live, exc)
            return
        except Exception as exc:  # noqa: BLE001 - a refusal: find the texts refused
            if len(texts) == 1:
                _fail_all(live, exc)
                return
            logger.warning("a model call of %d texts was refused (%s); embedding them one by one", len(texts), exc)
            await self._one_by_one(live)
            return
        self.batches += 1
        offset = 0
        for request in live:
            part = vectors[offset : offset + len(request.texts)]
            offset += len(request.texts)
            if not request.future.done():
                request.future.set_result(part)

    async def _one_by_one(self, requests: list[_Request]) -> None:
        """Each text of a refused call alone: a request gets its vectors, or the error of its first
        refused text (naming its position), so only the documents holding a refused text fail."""
        loop = asyncio.get_running_loop()
        for request in requests:
            vectors: list[np.ndarray] = []
            for position, text in enumerate(request.texts):
                if request.future.done():
                    break
                try:
                    vectors.append((await loop.run_in_executor(self._executor, self._embed, [text]))[0])
                except Exception as exc:  # noqa: BLE001 - delivered to the request that holds the text
                    request.future.set_exception(_refused_text(exc, position))
                    break
                self.batches += 1
            if not request.future.done():
                request.future.set_result(np.stack(vectors))

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        for task in list(self._calls):
            task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
