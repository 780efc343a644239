"""Parallel sampling (``n > 1``): one request, n sequences sharing the prompt's KV blocks.
Torch-free.

The request (index 0, the parent) runs alone until its prompt is computed and its first token
sampled. Right then, in ``update_from_output``, the other n - 1 sequences fork from it
(``ForkMixin._fork_children``): each child's block table starts with the parent's full prompt
blocks, shared by reference count (``BlockManager.fork``), up to but not including the block
that holds the last prompt token; that block is where the sequences diverge, so each child
writes its own copy of it by recomputing those tokens (at most ``block_size`` of them: a
copy-on-write done by recompute; a prompt within one block forks no table, so the prefix cache
may copy that block's cached head instead) and samples its own first token there. Children then
wait in the waiting queue at the parent's priority and arrival, so they start next as seats and
blocks allow; from there on they are ordinary requests (preemption, swap and finishing treat
them alone). Parked there, a child's blocks go to a request ahead of it that lacks blocks
(``ForkMixin._free_parked``): the child recomputes its prompt when it starts, instead of
holding blocks that nothing running would free. A child's seed is the parent's + its index (vLLM's rule), so seeded choices differ
and each stays reproducible.

Aborting the request (by the parent's id) aborts every sequence; a parent that ends before it
forked (an error, an abort) ends its unforked children the same way.

``GroupOutputs`` (in the engine's output path) turns the children's outputs into outputs of
the parent's id, each with its choice ``index`` and, when that sequence ended,
``choice_finish``; the merged output is ``finished`` only when every sequence is, and its
``num_output_tokens`` counts the tokens of all of them (quotas charge every completion token,
the prompt once).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.core.block_manager import BlockManager
from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from engine.core.request import Request
from engine.core.request_queue import RequestQueue
from engine.core.sampling_params import SamplingParams

SEP = "#"  # child ids: "<parent id>#<index>"


def child_id(parent_id: str, index: int) -> str:
    return f"{parent_id}{SEP}{index}"


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    seed = None if params.seed is None else params.seed + index
    return dataclasses.replace(params, n=1, seed=seed)


@dataclass
class ForkGroup:
    unforked: list[Request]  # children not yet in the scheduler
    live: set[str]  # the parent and forked children not finished yet


class ForkMixin:
    """The scheduler's side: register a group, fork after the prefill, end it together."""

    block_manager: BlockManager
    waiting: RequestQueue
    _requests: dict[str, Request]
    _to_return: dict[str, Request]
    _groups: dict[str, ForkGroup]  # by the parent's id
    _parent_of: dict[str, str]  # forked child id -> parent id

    def abort_request(self, request_id: str) -> None:
        raise NotImplementedError

    def _register_group(self, parent: Request) -> None:
        p = parent.sampling_params
        self._groups[parent.request_id] = ForkGroup([
            Request(child_id(parent.request_id, i), parent.prompt_token_ids, child_params(p, i),
                    priority=parent.priority, arrival_time=parent.arrival_time,
                    eos_token_id=parent.eos_token_id)
            for i in range(1, p.n)], {parent.request_id})

    def _fork_children(self, parent: Request) -> None:
        """Right after the parent's first token: its children join the waiting queue, each
        holding the shared prompt blocks (see the module doc)."""
        group = self._groups.get(parent.request_id)
        if group is None or not group.unforked:
            return
        bm = self.block_manager
        shared = (parent.num_prompt_tokens - 1) // bm.block_size  # the last one diverges
        for child in group.unforked:
            cid = child.request_id
            bm.fork(parent.request_id, cid, shared)
            child.num_computed_tokens = shared * bm.block_size
            self._requests[cid] = child
            self._parent_of[cid] = parent.request_id
            group.live.add(cid)
            self.waiting.add(child)
        group.unforked = []

    def _abort_group(self, request_id: str) -> None:
        """Aborting an n > 1 request (by its id) aborts its other sequences too, even once
        the parent itself has finished."""
        group = self._groups.get(request_id)
        if group is not None:
            for cid in [c for c in group.live if c != request_id]:
                self.abort_request(cid)

    def _free_parked(self, ahead: Request, need_blocks: int) -> bool:
        """Drop the prompt KV of the last forked sequence waiting behind ``ahead`` (queued
        after it; for a running or swapped ``ahead``, any of its priority or lower: those never
        displace it), when all of them together hold enough to make ``need_blocks`` free
        (else no work is dropped for nothing). False when nothing was dropped.

        Why: parked in the waiting queue, a child's blocks could be the ones ``ahead`` needs
        while nothing that runs would ever free them (the fuzzed scheduler: a request
        preempting itself every few steps forever for a block a parked child held, or nothing
        running at all). A dropped child recomputes its prompt when it starts (the prefix
        cache may still hold it); it never ran, so this is no preemption and counts as none.
        """
        if not self._parent_of:  # no forked sequence alive: nothing can be parked
            return False
        bm = self.block_manager
        parked = [r for r in self._queued_behind(ahead)
                  if r.request_id in self._parent_of and bm.num_device_blocks_of(r.request_id)]
        if not parked or (bm.num_free_blocks + bm.blocks_freed_by(r.request_id for r in parked)
                          < need_blocks):
            return False
        # one a call, the caller retrying its allocation in between (a prefix hit it revives
        # takes a free block too): each True drops a table, so the retries end
        victim = parked[-1]
        bm.free(victim.request_id)
        victim.num_computed_tokens = 0
        return True

    def _queued_behind(self, ahead: Request) -> list[Request]:
        if ahead.request_id in self.waiting:
            queue = list(self.waiting)
            return queue[queue.index(ahead) + 1:]
        return [r for r in self.waiting if r.priority >= ahead.priority]

    def _group_member_finished(self, req: Request, returned: bool) -> None:
        """Bookkeeping when a sequence of a group finishes. A parent that ends before its
        children forked ends them the same way (returned with it)."""
        rid = req.request_id
        pid = self._parent_of.pop(rid, rid)
        group = self._groups.get(pid)
        if group is None:
            return
        if rid == pid:
            for child in group.unforked:
                child.status, child.error = req.status, req.error
                child.times.finished = req.times.finished
                if returned:
                    self._to_return[child.request_id] = child
            group.unforked = []
        group.live.discard(rid)
        if not group.live:
            del self._groups[pid]


@dataclass
class _Merge:
    n: int
    tokens: dict[int, int] = field(default_factory=dict)  # index -> output tokens so far
    ended: dict[int, str] = field(default_factory=dict)  # index -> finish reason
    error: str | None = None
    cached: int = 0


class GroupOutputs:
    """The engine's side: children's outputs become outputs of the parent's id."""

    def __init__(self) -> None:
        self._groups: dict[str, _Merge] = {}
        self._members: dict[str, tuple[str, int]] = {}  # sequence id -> (request id, index)

    def register(self, request_id: str, n: int) -> None:
        if n > 1:
            self._groups[request_id] = _Merge(n)
            self._members[request_id] = (request_id, 0)
            for i in range(1, n):
                self._members[child_id(request_id, i)] = (request_id, i)

    def merge(self, out: RequestOutput) -> RequestOutput:
        member = self._members.get(out.request_id)
        if member is None:
            return out
        parent, index = member
        group = self._groups[parent]
        group.tokens[index] = out.num_output_tokens
        if index == 0:
            group.cached = out.num_cached_tokens
        if out.finished:
            group.ended[index] = str(out.finish_reason or FinishReason.STOP)
            group.error = group.error or out.error
        done = len(group.ended) == group.n
        if done:
            del self._groups[parent]
            for i in range(group.n):
                self._members.pop(child_id(parent, i) if i else parent, None)
        return dataclasses.replace(
            out, request_id=parent, index=index, finished=done,
            choice_finish=group.ended.get(index) if out.finished else None,
            finish_reason=_group_reason(group.ended.values()) if done else None,
            num_output_tokens=sum(group.tokens.values()), num_cached_tokens=group.cached,
            error=group.error if done else None)


def _group_reason(reasons: object) -> str:
    """One reason for the whole request (its outcome): an error or abort of any sequence
    wins, then length, then stop."""
    seen = set(reasons)  # type: ignore[call-overload]
    for reason in (FinishReason.ERROR, FinishReason.ABORT, FinishReason.LENGTH):
        if reason in seen:
            return str(reason)
    return str(FinishReason.STOP)
