"""The ``lethe.v1.Threads`` servicer."""

from __future__ import annotations

import re
from collections.abc import Callable

import grpc

from lethe.v1 import common_pb2, threads_pb2, threads_pb2_grpc
from server._names import check_id, new_id, parse_manifest, parse_owner, parse_thread, parse_turn
from server._steps import step
from server.edge import authorize
from server.errors import InvalidArgument, Reason
from server.retrieval import Retriever, echo_shingles, plain_text
from server.services._common import (
    MAX_BATCH,
    MAX_SPEAKER_BYTES,
    MAX_TEXT_BYTES,
    MAX_TITLE_BYTES,
    REQUEST_ID_RE,
    STEP_TURNS,
    check_text,
    check_vector,
    duration,
    fit,
    owner_page,
    page_size,
    page_tokens,
    seconds,
    source_refs,
    states,
    view_full,
)
from server.services._convert import memory_proto, thread_proto, turn_proto
from server.store import MemoryDraft, Store, TurnDraft, TurnView


class ThreadsService(threads_pb2_grpc.ThreadsServicer):
    """``lethe.v1.Threads``."""

    def __init__(
        self,
        store: Store,
        retriever: Retriever,
        pending_ttl: float,
        proposer: Callable[
            [str, threads_pb2.AppendTurnsRequest, list[TurnDraft]], list[list[MemoryDraft]]
        ]
        | None = None,
    ) -> None:
        self.store = store
        self.retriever = retriever
        self.pending_ttl = pending_ttl
        # Turns -> candidate memories (client tags, or the write-time rules).
        self.proposer = proposer
        self.page_tokens = page_tokens()

    def CreateThread(  # noqa: N802
        self, request: threads_pb2.CreateThreadRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        """``Threads.CreateThread``: create a conversation thread and its own encryption ring."""
        owner = parse_owner(request.parent, "parent")
        authorize(owner)
        thread = check_id(request.thread_id, "thread_id") if request.thread_id else new_id()
        title = check_text(request.title, "title", limit=MAX_TITLE_BYTES, required=False)
        return thread_proto(self.store.create_thread(owner, thread, title))

    def GetThread(  # noqa: N802
        self, request: threads_pb2.GetThreadRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Thread:
        """``Threads.GetThread``: read a thread (conversation or repair)."""
        name = parse_thread(request.name, "name")
        authorize(name.owner)
        return thread_proto(self.store.get_thread(name.owner, name.thread))

    def ListThreads(  # noqa: N802
        self, request: threads_pb2.ListThreadsRequest, context: grpc.ServicerContext
    ) -> threads_pb2.ListThreadsResponse:
        """``Threads.ListThreads``: one page of the owner's live threads, in id order."""
        owner, size, after = owner_page(request, self.page_tokens)
        views, nxt = self.store.list_threads(owner, after, size, request.include_repairs)
        threads, nxt = fit(
            [thread_proto(v) for v in views], nxt, lambda t: t.name.rsplit("/", 1)[-1]
        )
        return threads_pb2.ListThreadsResponse(
            threads=threads,
            next_page_token=self.page_tokens.issue(request, nxt),
        )

    def _drafts(self, request: threads_pb2.AppendTurnsRequest, owner: str) -> list[TurnDraft]:
        if not request.turns:
            raise InvalidArgument("turns", "at least one turn is required")
        if len(request.turns) > MAX_BATCH:
            raise InvalidArgument("turns", f"at most {MAX_BATCH} turns per call")
        drafts = []
        for i, turn in enumerate(request.turns):
            field = f"turns[{i}]"
            if turn.role not in (
                common_pb2.USER,
                common_pb2.ASSISTANT,
                common_pb2.SYSTEM,
                common_pb2.TOOL,
            ):
                raise InvalidArgument(f"{field}.role", "must be USER, ASSISTANT, SYSTEM or TOOL")
            text = check_text(turn.text, f"{field}.text", limit=MAX_TEXT_BYTES, required=True)
            speaker = check_text(
                turn.speaker, f"{field}.speaker", limit=MAX_SPEAKER_BYTES, required=False
            )
            when = None
            if turn.HasField("time"):
                if not 0 <= turn.time.nanos < 1_000_000_000 or not (
                    0 <= turn.time.seconds <= 253402300799
                ):
                    raise InvalidArgument(f"{field}.time", "out of range")
                when = seconds(turn.time)
            manifest = turn.context_manifest
            if manifest:
                try:
                    manifest_owner = parse_manifest(manifest, f"{field}.context_manifest").owner
                except InvalidArgument:
                    manifest_owner = ""
                if manifest_owner != owner:
                    raise InvalidArgument(
                        f"{field}.context_manifest", "must be a manifest name of the same owner"
                    )
            drafts.append(
                TurnDraft(
                    role=int(turn.role),
                    speaker=speaker,
                    text=text,
                    time=when,
                    embedding=check_vector(turn.embedding, f"{field}.embedding"),
                    context_manifest=manifest,
                    context_refs=source_refs(turn.context_refs, owner, f"{field}.context_refs"),
                    commit=turn.commit,
                    pending_ttl=duration(
                        turn.pending_ttl, f"{field}.pending_ttl", self.pending_ttl
                    ),
                )
            )
        return drafts

    def AppendTurns(  # noqa: N802
        self, request: threads_pb2.AppendTurnsRequest, context: grpc.ServicerContext
    ) -> threads_pb2.AppendTurnsResponse:
        """``Threads.AppendTurns``: append 1..1000 turns to a thread in one transaction."""
        name = parse_thread(request.parent, "parent")
        authorize(name.owner)
        if request.request_id and not REQUEST_ID_RE.fullmatch(request.request_id):
            raise InvalidArgument("request_id", "must match [A-Za-z0-9._:-]{1,128}")
        drafts = self._drafts(request, name.owner)
        embedder = self.retriever.embedder
        for i, draft in enumerate(drafts):
            if (
                embedder
                and draft.embedding is not None
                and draft.embedding.shape[0] != embedder.dim
            ):
                raise InvalidArgument(
                    f"turns[{i}].embedding",
                    f"dimension {draft.embedding.shape[0]} differs from the server embedder's "
                    f"{embedder.dim}",
                    reason=Reason.DIMENSION_MISMATCH,
                )
        if request.request_id:
            prior = self.store.find_request(name.owner, name.thread, request.request_id)
            if prior is not None:
                return self._replay(prior, request.echo_text)
        missing = [i for i, d in enumerate(drafts) if d.embedding is None]
        for lo in range(0, len(missing), STEP_TURNS):  # in steps: see server._steps
            chunk = missing[lo : lo + STEP_TURNS]
            vectors = self.retriever.embed_texts(
                [_indexed_text(drafts[i].speaker, drafts[i].text) for i in chunk],
                owner=name.owner,
            )
            for i, vec in zip(chunk, vectors, strict=True):
                drafts[i].embedding = vec
            step()
        candidates = self.proposer(name.owner, request, drafts) if self.proposer else []
        step()
        removals = self.retriever.removals(name.owner)  # before the write: see on_write
        metas, retried, proposed = self.store.append_turns(
            name.owner,
            name.thread,
            drafts,
            request.request_id,
            candidates=candidates,
            pending_ttl=self.pending_ttl,
            shingler=echo_shingles,
        )
        if retried:
            return self._replay([m.rid for m in metas], request.echo_text)
        step()  # committed; the owner's indexes follow (no lock held here)
        written = {
            m.rid: (plain_text(d.speaker, d.text), d.embedding)
            for m, d in zip(metas, drafts, strict=True)
        }
        self.retriever.on_write(
            name.owner, [*metas, *(v.meta for v in proposed)], written, removals
        )
        return threads_pb2.AppendTurnsResponse(
            turns=[
                turn_proto(TurnView(meta, draft.text, draft.speaker), text=request.echo_text)
                for meta, draft in zip(metas, drafts, strict=True)
            ],
            proposed=[memory_proto(v) for v in proposed],
        )

    def _replay(self, rids: list[int], echo_text: bool) -> threads_pb2.AppendTurnsResponse:
        """The first result of a retried append, through the visibility rules.

        A turn since deleted, expired, sealed or tainted is left out.
        """
        return threads_pb2.AppendTurnsResponse(
            turns=[turn_proto(v, text=echo_text) for v in self.store.replay_turns(rids)]
        )

    def ListTurns(  # noqa: N802
        self, request: threads_pb2.ListTurnsRequest, context: grpc.ServicerContext
    ) -> threads_pb2.ListTurnsResponse:
        """``Threads.ListTurns``: one page of a thread's visible turns, in seq order."""
        name = parse_thread(request.parent, "parent")
        authorize(name.owner)
        size = page_size(request.page_size)
        after = self.page_tokens.resume(request)
        if after and not re.fullmatch(r"[1-9][0-9]{0,17}", after):
            raise InvalidArgument("page_token", "not a token from a previous page of this listing")
        views, nxt = self.store.list_turns(
            name.owner,
            name.thread,
            int(after) if after else 0,
            size,
            states=states(request.states),
            include_tainted=request.include_tainted,
            with_embedding=view_full(request.view),
        )
        turns, nxt = fit([turn_proto(v) for v in views], nxt, lambda t: int(t.seq))
        return threads_pb2.ListTurnsResponse(
            turns=turns,
            next_page_token=self.page_tokens.issue(request, str(nxt) if nxt else ""),
        )

    def GetTurn(  # noqa: N802
        self, request: threads_pb2.GetTurnRequest, context: grpc.ServicerContext
    ) -> threads_pb2.Turn:
        """``Threads.GetTurn``: read one turn."""
        name = parse_turn(request.name, "name")
        authorize(name.owner)
        full = view_full(request.view)
        return turn_proto(self.store.get_turn(name.owner, name.thread, name.seq, full))


def _indexed_text(speaker: str, text: str) -> str:
    """What the server embeds for a turn: ``speaker: text``.

    The speaker's name carries meaning in questions such as
    "When did Caroline ...".
    """
    return f"{speaker}: {text}" if speaker else text
