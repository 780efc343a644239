"""Compiled grammars, cached by spec hash with a bounded size, compiled off the step thread.
Torch-free.

``GrammarCompiler.submit(spec)`` returns a future that is done once ``spec``'s grammar is
compiled (at once on a cache hit); compiling runs on the compiler's own thread pool, so a
slow schema delays only the request that brought it: the engine front posts a constrained
request to the step thread only when its future is done (``engine.frontend.async_engine``).
``matcher(spec)`` hands each sequence its own parser: a copy of the cached one, so the
grammar is compiled once however many requests use it.

The cache holds at most ``capacity`` grammars, least recently used out first; a spec that
failed to compile is cached with its error too (a client retrying a bad schema costs one
compile). The tokenizer view (about a second for 49k tokens) is built on first use.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from engine.core.structured import StructuredSpec
from engine.structured import backend

DEFAULT_CAPACITY = 256


class GrammarError(ValueError):
    """A spec the backend refuses; the message is the backend's (names what is wrong)."""


class CompileTooSlow(GrammarError):
    """A spec refused because compiling it took too long (``refuse``)."""


class GrammarCompiler:
    def __init__(self, hf_tokenizer: Any, eos_token_ids: list[int] | None = None,
                 capacity: int = DEFAULT_CAPACITY, workers: int = 1) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._eos = list(eos_token_ids or [])
        self.capacity = capacity
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._cache: OrderedDict[str, Any] = OrderedDict()  # key -> matcher or GrammarError
        self._pending: dict[str, Future[None]] = {}
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self.compiles = 0  # grammars compiled (cache misses), for tests and stats

    @property
    def tokenizer(self) -> Any:
        """llguidance's tokenizer, built on first use (any thread)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = backend.make_tokenizer(self._hf_tokenizer, self._eos)
            return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    def __len__(self) -> int:
        return len(self._cache)

    def submit(self, spec: StructuredSpec) -> Future[None]:
        """A future done when ``spec`` is compiled; its exception is the ``GrammarError``
        when the spec does not compile. Never blocks on a compile."""
        key = spec.key
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                done: Future[None] = Future()
                entry = self._cache[key]
                if isinstance(entry, GrammarError):
                    done.set_exception(entry)
                else:
                    done.set_result(None)
                return done
            pending = self._pending.get(key)
            if pending is not None:
                return pending
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers,
                                                thread_name_prefix="carpool-grammar")
            future = self._pool.submit(self._compile, spec)
            self._pending[key] = future
            return future

    def compile(self, spec: StructuredSpec) -> None:
        """Compile ``spec`` now, on this thread (GrammarError when it does not compile)."""
        self._compiled(spec)

    def matcher(self, spec: StructuredSpec) -> Any:
        """A fresh parser for ``spec`` (compiled here on a cache miss)."""
        return self._compiled(spec).deep_copy()

    def refuse(self, spec: StructuredSpec, reason: str) -> None:
        """From now on ``spec`` fails with ``reason`` (a compile too slow to wait for: a
        retry is refused at once, even after the compile in progress ends)."""
        self._store(spec.key, CompileTooSlow(reason), replace_refusal=True)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _compiled(self, spec: StructuredSpec) -> Any:
        key = spec.key
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
        if entry is None:
            entry = self._build(spec)
            self._store(key, entry)
        if isinstance(entry, GrammarError):
            raise entry
        return entry

    def _compile(self, spec: StructuredSpec) -> None:
        try:
            entry = self._build(spec)
            self._store(spec.key, entry)
        finally:
            with self._lock:
                self._pending.pop(spec.key, None)
        if isinstance(entry, GrammarError):
            raise entry

    def _build(self, spec: StructuredSpec) -> Any:
        tokenizer = self.tokenizer
        self.compiles += 1
        try:
            grammar = backend.grammar_text(spec)
            error = backend.check(grammar, tokenizer)
            if error is not None:
                return GrammarError(error)
            matcher = backend.new_matcher(grammar, tokenizer)
            matcher.compute_bitmask()  # builds the lexer's first states once, for every copy
            return matcher
        except ValueError as exc:  # a source of the wrong shape (not JSON, not a list)
            return GrammarError(str(exc))

    def _store(self, key: str, entry: Any, replace_refusal: bool = False) -> None:
        with self._lock:
            if not replace_refusal and isinstance(self._cache.get(key), GrammarError):
                return  # refused (``refuse``): a compile that ends later does not undo it
            self._cache[key] = entry
            self._cache.move_to_end(key)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
