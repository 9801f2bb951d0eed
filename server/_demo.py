"""``lethe demo``: the main job on real conversations.

Starts a server on the data directory (default ``./lethe-data``), ingests the
LoCoMo conversations (Maharana et al., ACL 2024; CC BY-NC 4.0, read from
``../shared/data/locomo/locomo10.json`` and never copied into this
repository) — one owner per conversation, one thread per session, one turn per
dialog turn — commits them, runs every QA question as a ``Search`` over gRPC
and reports recall@k of the evidence dialog ids per category, with search
latency against two floors measured in the same run (an empty gRPC call and
raw in-process FAISS). Then it backs the store up, forgets one session, shows
its evidence is no longer retrievable, restores the backup beside the keystore
and shows the restore does not bring it back. Figures go to a JSON file.

Scoring follows ``shared/data/README.md``: recall@k = |R ∩ E| / |E| averaged
over items with evidence, hit@k = 1 if R ∩ E ≠ ∅; categories 1-4 are the
headline (1,536 items), category 5 (adversarial) is reported separately.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tqdm import tqdm

from lethe.v1 import (
    common_pb2,
    lifecycle_pb2,
    lifecycle_pb2_grpc,
    repairs_pb2,
    repairs_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
    threads_pb2,
    threads_pb2_grpc,
)

KS = (1, 5, 10, 20)
CATEGORY_NAMES = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
_DIA_RE = re.compile(r"D(\d+):(\d+)")


@dataclass
class Conversation:
    """One conversation: sessions of (speaker, dia_id, text) with their dates."""

    sample_id: str
    sessions: dict[int, list[tuple[str, str, str]]]
    dates: dict[int, float]
    qa: list[dict[str, Any]] = field(default_factory=list)

    @property
    def owner(self) -> str:
        return "locomo-" + re.sub(r"[^a-z0-9-]", "-", self.sample_id.lower())


def _parse_date(text: str) -> float:
    return datetime.strptime(text, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).timestamp()


def load_locomo(path: Path) -> list[Conversation]:
    """Read ``locomo10.json`` into conversations (sessions in order, captions kept)."""
    out = []
    for sample in json.loads(path.read_text()):
        conv = sample["conversation"]
        sessions: dict[int, list[tuple[str, str, str]]] = {}
        dates: dict[int, float] = {}
        for key, value in conv.items():
            m = re.fullmatch(r"session_(\d+)", key)
            if m and isinstance(value, list) and value:
                n = int(m.group(1))
                turns = []
                for turn in value:
                    text = turn["text"]
                    if turn.get("blip_caption"):
                        text += f" [image: {turn['blip_caption']}]"
                    turns.append((turn["speaker"], turn["dia_id"], text))
                sessions[n] = turns
                dates[n] = _parse_date(conv[f"session_{n}_date_time"])
        out.append(
            Conversation(sample["sample_id"], dict(sorted(sessions.items())), dates, sample["qa"])
        )
    return out


def sample_conversation() -> list[Conversation]:
    """A short conversation written for this project, used when LoCoMo is absent."""
    s1 = [
        ("Ana", "D1:1", "I finally adopted a rescue greyhound last weekend, her name is Comet."),
        ("Ben", "D1:2", "That's wonderful! How is Comet settling in?"),
        ("Ana", "D1:3", "She sleeps all day on the sofa and sprints in the park at dusk."),
        ("Ben", "D1:4", "I started learning the cello in March, my teacher is very patient."),
    ]
    s2 = [
        ("Ana", "D2:1", "I'm moving to Lisbon in September for a new job at a design studio."),
        ("Ben", "D2:2", "Lisbon! Will you bring Comet with you?"),
        ("Ana", "D2:3", "Yes, the flat has a small garden, perfect for her."),
        ("Ben", "D2:4", "My cello recital is on the 14th of June, I'm nervous."),
    ]
    qa = [
        {"question": "What is the name of Ana's dog?", "evidence": ["D1:1"], "category": 4},
        {"question": "Where is Ana moving?", "evidence": ["D2:1"], "category": 4},
        {"question": "What instrument does Ben play?", "evidence": ["D1:4"], "category": 4},
        {"question": "When is Ben's recital?", "evidence": ["D2:4"], "category": 2},
        {
            "question": "Will the dog have a garden in the new home?",
            "evidence": ["D2:2", "D2:3"],
            "category": 1,
        },
    ]
    base = datetime(2024, 3, 1, tzinfo=UTC).timestamp()
    return [Conversation("sample-1", {1: s1, 2: s2}, {1: base, 2: base + 86400 * 30}, qa)]


def normalise_evidence(raw: list[str], known: set[str]) -> tuple[list[str], int]:
    """Split squeezed ids, fix ``D30:05`` and ``D:11:26``; drop what matches no turn.

    Returns:
        (normalised ids in order without duplicates, number of references dropped).
    """
    out: list[str] = []
    dropped = 0
    for ref in raw:
        parts = [p for p in re.split(r"[;\s]+", ref.replace("D:", "D")) if p]
        if not parts:
            dropped += 1
        for part in parts:
            m = _DIA_RE.fullmatch(part)
            dia = f"D{int(m.group(1))}:{int(m.group(2))}" if m else part
            if dia in known:
                if dia not in out:
                    out.append(dia)
            else:
                dropped += 1
    return out, dropped


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _reason(err: grpc.RpcError) -> str:
    from server._probe import reason_of

    return reason_of(err)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


class _Api:
    """Stubs plus the admin token's metadata."""

    def __init__(self, port: int, token: str) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.md = (("authorization", f"Bearer {token}"),)
        self.threads = threads_pb2_grpc.ThreadsStub(self.channel)
        self.retrieval = retrieval_pb2_grpc.RetrievalStub(self.channel)
        self.lifecycle = lifecycle_pb2_grpc.LifecycleStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()


def _ingest(api: _Api, convs: list[Conversation]) -> dict[str, dict[str, str]]:
    """Create threads, append turns (pending), then commit. Returns owner → name → dia_id."""
    names: dict[str, dict[str, str]] = {}
    total = sum(len(t) for c in convs for t in c.sessions.values())
    with tqdm(total=total, desc="ingest turns", unit="turn") as bar:
        for conv in convs:
            owner_names: dict[str, str] = {}
            for n, turns in conv.sessions.items():
                thread = api.threads.CreateThread(
                    threads_pb2.CreateThreadRequest(
                        parent=f"owners/{conv.owner}",
                        thread_id=f"session-{n}",
                        title=f"{conv.sample_id} session {n}",
                    ),
                    metadata=api.md,
                )
                inputs = [
                    threads_pb2.TurnInput(
                        role=common_pb2.USER, speaker=speaker, text=text, time=_ts(conv.dates[n])
                    )
                    for speaker, _, text in turns
                ]
                resp = api.threads.AppendTurns(
                    threads_pb2.AppendTurnsRequest(
                        parent=thread.name, turns=inputs, request_id=f"ingest-{n}"
                    ),
                    metadata=api.md,
                )
                for turn, (_, dia, _) in zip(resp.turns, turns, strict=True):
                    owner_names[turn.name] = dia
                bar.update(len(turns))
            pending = list(owner_names)
            for start in range(0, len(pending), 1000):
                api.lifecycle.Commit(
                    lifecycle_pb2.CommitRequest(names=pending[start : start + 1000]),
                    metadata=api.md,
                )
            names[conv.owner] = owner_names
    return names


@dataclass
class _Item:
    owner: str
    question: str
    evidence: list[str]
    category: int


def _items(convs: list[Conversation]) -> tuple[list[_Item], int, int]:
    items: list[_Item] = []
    dropped = 0
    empty = 0
    for conv in convs:
        known = {dia for turns in conv.sessions.values() for _, dia, _ in turns}
        for qa in conv.qa:
            ev, d = normalise_evidence([str(e) for e in qa.get("evidence", [])], known)
            dropped += d
            if not ev:
                empty += 1
                continue
            items.append(_Item(conv.owner, str(qa["question"]), ev, int(qa["category"])))
    return items, dropped, empty


MODES = {
    "HYBRID": retrieval_pb2.SearchRequest.HYBRID,
    "DENSE": retrieval_pb2.SearchRequest.DENSE,
    "LEXICAL": retrieval_pb2.SearchRequest.LEXICAL,
}


def _run_queries(
    api: _Api,
    items: list[_Item],
    names: dict[str, dict[str, str]],
    desc: str,
    mode: str = "HYBRID",
) -> tuple[list[list[str]], list[float]]:
    results: list[list[str]] = []
    latencies: list[float] = []
    for item in tqdm(items, desc=desc, unit="q"):
        req = retrieval_pb2.SearchRequest(
            parent=f"owners/{item.owner}",
            query_text=item.question,
            top_k=max(KS),
            mode=MODES[mode],
        )
        start = time.perf_counter()
        resp = api.retrieval.Search(req, metadata=api.md)
        latencies.append(time.perf_counter() - start)
        results.append([names[item.owner].get(h.turn.name, "?") for h in resp.hits])
    return results, latencies


def _score(items: list[_Item], results: list[list[str]]) -> dict[str, Any]:
    groups: dict[str, list[tuple[_Item, list[str]]]] = defaultdict(list)
    for item, got in zip(items, results, strict=True):
        groups[f"{item.category} {CATEGORY_NAMES.get(item.category, '?')}"].append((item, got))
        if item.category in (1, 2, 3, 4):
            groups["overall (1-4)"].append((item, got))
    out: dict[str, Any] = {}
    for group, rows in sorted(groups.items()):
        entry: dict[str, Any] = {"items": len(rows)}
        for k in KS:
            rec = [len(set(got[:k]) & set(it.evidence)) / len(it.evidence) for it, got in rows]
            hit = [1.0 if set(got[:k]) & set(it.evidence) else 0.0 for it, got in rows]
            entry[f"recall@{k}"] = round(statistics.fmean(rec), 4)
            entry[f"hit@{k}"] = round(statistics.fmean(hit), 4)
        out[group] = entry
    return out


def _floors(api: _Api, server: Any, owner: str, queries: list[str]) -> dict[str, float]:
    """Medians (ms) of the floors, measured in the same run as the searches."""
    empty = []
    for _ in range(300):
        start = time.perf_counter()
        api.health.Check(health_pb2.HealthCheckRequest())
        empty.append(time.perf_counter() - start)
    import faiss

    retriever = server.retriever
    metas = list(server.store.owner_turns(owner))
    _, vecs = server.store.embeddings(metas)
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs / np.linalg.norm(vecs, axis=1, keepdims=True))
    qvecs = retriever.embedder.embed(queries)
    raw = []
    for q in qvecs:
        start = time.perf_counter()
        flat.search(q[None, :], max(KS))
        raw.append(time.perf_counter() - start)
    emb = []
    for q in queries[:300]:
        start = time.perf_counter()
        retriever.embedder.embed([q])
        emb.append(time.perf_counter() - start)
    return {
        "empty_grpc_call_p50_ms": statistics.median(empty) * 1e3,
        "raw_faiss_search_p50_ms": statistics.median(raw) * 1e3,
        "query_embedding_p50_ms": statistics.median(emb) * 1e3,
    }


def _scan(root: Path, needles: list[bytes]) -> int:
    """How many (file, needle) pairs have the needle in the file's raw bytes."""
    hits = 0
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += sum(1 for n in needles if n in data)
    return hits


def _find_locomo(arg: Path | None) -> Path | None:
    if arg is not None:
        return arg if arg.exists() else None
    here = Path(__file__).resolve().parents[1]
    for cand in (
        Path("../shared/data/locomo/locomo10.json"),
        here.parent / "shared/data/locomo/locomo10.json",
    ):
        if cand.exists():
            return cand
    return None


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; returns the process exit status (1 if a forgetting check fails)."""
    from server._app import LetheServer, ServerConfig
    from server._auth import new_token, principal_record, token_digest
    from server.cli import main as cli_main

    path = _find_locomo(args.locomo)
    if path is None:
        print(
            "LoCoMo not found (looked for ../shared/data/locomo/locomo10.json): running on a "
            "short sample conversation written for this project instead."
        )
        convs = sample_conversation()
        source = "sample"
    else:
        convs = load_locomo(path)
        source = str(path)
    if args.conversations:
        convs = convs[: args.conversations]
    data_dir: Path = args.data
    config = ServerConfig(
        data_dir=data_dir, listen="127.0.0.1:0", metrics_listen=None, kek_file=args.kek_file
    )
    server = LetheServer(config)
    port = server.start()
    token = new_token()
    server.store.put_token(token_digest(token), principal_record([], True))
    api = _Api(port, token)
    report: dict[str, Any] = {"source": source, "data_dir": str(data_dir.resolve())}
    failures: list[str] = []
    try:
        print(f"server on 127.0.0.1:{port}, data in {data_dir.resolve()}")
        for conv in convs:  # a previous run's data: forget it first
            api.lifecycle.Forget(
                lifecycle_pb2.ForgetRequest(names=[f"owners/{conv.owner}"], reason="demo-reset"),
                metadata=api.md,
            )
        start = time.perf_counter()
        names = _ingest(api, convs)
        ingest_s = time.perf_counter() - start
        n_turns = sum(len(v) for v in names.values())
        print(
            f"ingested and committed {n_turns} turns of {len(convs)} conversations "
            f"({sum(len(c.sessions) for c in convs)} sessions) in {ingest_s:.1f} s"
        )
        items, dropped, empty = _items(convs)
        tune_owners = {c.owner for c in convs[:5]}
        splits: dict[str, Callable[[_Item], bool]] = {
            "all": lambda it: True,
            "tune (conv 1-5)": lambda it: it.owner in tune_owners,
            "held-out (conv 6-10)": lambda it: it.owner not in tune_owners,
        }
        per_mode: dict[str, Any] = {}
        mode_latency: dict[str, Any] = {}
        results: list[list[str]] = []
        for mode in MODES:
            got, latencies = _run_queries(api, items, names, f"search {mode}", mode)
            if mode == "HYBRID":
                results = got
            per_mode[mode] = {
                split: _score(
                    [i for i in items if keep(i)],
                    [r for i, r in zip(items, got, strict=True) if keep(i)],
                )
                for split, keep in splits.items()
                if any(keep(i) for i in items)
            }
            mode_latency[mode] = {
                "p50_ms": round(_pct(latencies, 50) * 1e3, 3),
                "p99_ms": round(_pct(latencies, 99) * 1e3, 3),
            }
        floors = _floors(api, server, convs[0].owner, [i.question for i in items])
        hybrid_p50 = mode_latency["HYBRID"]["p50_ms"]
        report.update(
            turns=n_turns,
            conversations=len(convs),
            ingest_seconds=round(ingest_s, 2),
            questions=len(items),
            evidence_refs_dropped=dropped,
            items_without_evidence=empty,
            recall=per_mode["HYBRID"]["all"],
            recall_by_mode=per_mode,
            latency_ms={
                **{f"search_{m}": v for m, v in mode_latency.items()},
                **{k: round(v, 4) for k, v in floors.items()},
                "hybrid_p50_over_dense_p50": round(hybrid_p50 / mode_latency["DENSE"]["p50_ms"], 2),
                "hybrid_p50_over_empty_call": round(
                    hybrid_p50 / floors["empty_grpc_call_p50_ms"], 2
                ),
            },
        )
        _print_scores(per_mode, report["latency_ms"], dropped, empty)

        # Back up, then forget the session holding the most evidence of conversation 1.
        backup_dir = Path(tempfile.mkdtemp(prefix="lethe-demo-backup-")) / "backup"
        if (
            cli_main(
                ["backup", "--data", str(data_dir), "--out", str(backup_dir)]
                + (["--kek-file", str(args.kek_file)] if args.kek_file else [])
            )
            != 0
        ):
            failures.append("backup failed")
        first = convs[0]
        per_session: dict[int, int] = defaultdict(int)
        for item in items:
            if item.owner == first.owner:
                for dia in item.evidence:
                    per_session[int(_DIA_RE.fullmatch(dia).group(1))] += 1  # type: ignore[union-attr]
        session = max(per_session, key=lambda s: per_session[s])
        gone = {dia for _, dia, _ in first.sessions[session]}
        needles = [text.encode() for _, _, text in first.sessions[session] if len(text) > 40][:5]
        thread_name = f"owners/{first.owner}/threads/session-{session}"
        receipt = api.lifecycle.Forget(
            lifecycle_pb2.ForgetRequest(names=[thread_name]), metadata=api.md
        )
        dests = [f"{d.name}:{'done' if d.done else 'OUTSTANDING'}" for d in receipt.destinations]
        print(
            f"\nforgot {thread_name}: {receipt.deleted} turns, receipt {receipt.name}, "
            f"destinations {dests}"
        )
        affected = [i for i in items if i.owner == first.owner and set(i.evidence) & gone]
        after, _ = _run_queries(api, affected, names, "re-query affected")
        leaked = sum(1 for got in after if set(got) & gone)
        probe = next(n for n, d in names[first.owner].items() if d in gone)
        try:
            api.threads.GetTurn(threads_pb2.GetTurnRequest(name=probe), metadata=api.md)
            get_result = "READABLE"
        except grpc.RpcError as err:
            get_result = f"{err.code().name}/{_reason(err)}"
        others = [i for i in items if i.owner != first.owner]
        other_before = [r for i, r in zip(items, results, strict=True) if i.owner != first.owner]
        other_after, _ = _run_queries(api, others, names, "re-query other conversations")
        unchanged = other_before == other_after
        plain_data = _scan(data_dir, needles)
        plain_backup = _scan(backup_dir, needles)
        print(
            f"queries with evidence in the forgotten session: {len(affected)}; "
            f"top-{max(KS)} results still naming a forgotten turn: {leaked}"
        )
        print(f"GetTurn on a forgotten turn: {get_result}")
        print(f"other conversations' results unchanged: {unchanged}")
        print(f"forgotten plaintext found in data dir: {plain_data}, in backup: {plain_backup}")

        # Restore the pre-forget backup beside the live keystore.
        api.close()
        server.stop()
        rc = cli_main(
            ["restore", "--backup", str(backup_dir), "--data", str(data_dir)]
            + (["--kek-file", str(args.kek_file)] if args.kek_file else [])
        )
        server = LetheServer(config)
        port = server.start()
        server.store.put_token(token_digest(token), principal_record([], True))
        api = _Api(port, token)
        restored, _ = _run_queries(api, affected, names, "re-query after restore")
        leaked_restored = sum(1 for got in restored if set(got) & gone)
        try:
            api.threads.GetTurn(threads_pb2.GetTurnRequest(name=probe), metadata=api.md)
            get_restored = "READABLE"
        except grpc.RpcError as err:
            get_restored = f"{err.code().name}/{_reason(err)}"
        intact = 0
        for n in first.sessions:
            if n == session:
                continue
            resp = api.threads.ListTurns(
                threads_pb2.ListTurnsRequest(
                    parent=f"owners/{first.owner}/threads/session-{n}", page_size=1000
                ),
                metadata=api.md,
            )
            intact += len(resp.turns)
        expected_intact = sum(len(t) for n, t in first.sessions.items() if n != session)
        print(
            f"after restoring the pre-forget backup: forgotten turn {get_restored}; "
            f"results naming a forgotten turn: {leaked_restored}; other sessions of "
            f"{first.owner}: {intact}/{expected_intact} turns readable"
        )
        report["forget"] = {
            "thread": thread_name,
            "turns_forgotten": receipt.deleted,
            "affected_queries": len(affected),
            "leaked_after_forget": leaked,
            "get_forgotten_turn": get_result,
            "other_conversations_unchanged": unchanged,
            "plaintext_hits_data_dir": plain_data,
            "plaintext_hits_backup": plain_backup,
            "restore_exit": rc,
            "leaked_after_restore": leaked_restored,
            "get_forgotten_turn_after_restore": get_restored,
            "other_sessions_readable_after_restore": f"{intact}/{expected_intact}",
        }
        if leaked or leaked_restored or plain_data or plain_backup:
            failures.append("forgotten material was still reachable")
        if get_result != "NOT_FOUND/RECORD_DELETED" or get_restored != "NOT_FOUND/RECORD_DELETED":
            failures.append("GetTurn on a forgotten turn did not answer RECORD_DELETED")
        if intact != expected_intact or not unchanged or rc != 0:
            failures.append("the rest of the store was not intact")
        shutil.rmtree(backup_dir.parent, ignore_errors=True)
        repair = _repair_pass(api, convs[-1], names[convs[-1].owner])
        report["repair"] = repair
        if repair["failures"]:
            failures.extend(repair["failures"])
    finally:
        api.close()
        server.stop()
    report["failures"] = failures
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nfigures written to {args.out}")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print("all forgetting checks passed")
    return 0


def _repair_pass(api: _Api, conv: Conversation, names: dict[str, str]) -> dict[str, Any]:
    """Seal the second half of one session after the fact, reopen it, add a turn,
    pause, reopen, and conclude with DESTROY; check what stays reachable."""
    session = next(iter(conv.sessions))
    thread = f"owners/{conv.owner}/threads/session-{session}"
    turns = conv.sessions[session]
    # Seqs number on across re-runs (ids of forgotten threads continue), so the
    # session's seqs come from the names the server gave its turns.
    seqs = sorted(int(n.rsplit("/", 1)[-1]) for n in names if n.startswith(thread + "/"))
    half = max(1, len(turns) // 2)
    from_seq = seqs[half]
    sealed_texts = [text for _, _, text in turns[half:]]
    kept_texts = [text for _, _, text in turns[:half]]
    repairs = repairs_pb2_grpc.RepairsStub(api.channel)
    failures: list[str] = []

    sealed_names = {f"{thread}/turns/{seq}" for seq in seqs[half:]}
    kept_names = {f"{thread}/turns/{seq}" for seq in seqs[:half]}

    def found(text: str) -> bool:
        resp = api.retrieval.Search(
            retrieval_pb2.SearchRequest(parent=f"owners/{conv.owner}", query_text=text, top_k=10),
            metadata=api.md,
        )
        return any(
            h.turn.name in sealed_names | kept_names and h.turn.text == text for h in resp.hits
        )

    repair = repairs.SealRepair(
        repairs_pb2.SealRepairRequest(thread=thread, from_seq=from_seq), metadata=api.md
    )
    sealed_found = sum(found(t) for t in sealed_texts)
    kept_found = sum(found(t) for t in kept_texts)
    opened = repairs.ReopenRepair(
        repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=api.md
    )
    api.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=repair.name,
            turns=[
                threads_pb2.TurnInput(
                    role=common_pb2.USER,
                    text="(repair note) let's leave this part of the conversation here",
                )
            ],
        ),
        metadata=api.md,
    )
    repairs.PauseRepair(repairs_pb2.PauseRepairRequest(name=repair.name), metadata=api.md)
    again = repairs.ReopenRepair(repairs_pb2.ReopenRepairRequest(name=repair.name), metadata=api.md)
    done = repairs.ConcludeRepair(
        repairs_pb2.ConcludeRepairRequest(name=repair.name, outcome=threads_pb2.RepairInfo.DESTROY),
        metadata=api.md,
    )
    probe = f"{thread}/turns/{from_seq}"
    try:
        api.threads.GetTurn(threads_pb2.GetTurnRequest(name=probe), metadata=api.md)
        after = "READABLE"
    except grpc.RpcError as err:
        after = f"{err.code().name}/{_reason(err)}"
    print(
        f"\nrepair: sealed {thread} from turn {from_seq} ({len(sealed_texts)} turns) into "
        f"{repair.name}; search finds {sealed_found} sealed and {kept_found}/{len(kept_texts)} "
        f"kept turns; reopen returned {len(opened.turns)} turns, after one more turn and a "
        f"pause {len(again.turns)}; DESTROY receipt {done.receipt.name} deleted "
        f"{done.receipt.deleted}; GetTurn on a sealed turn now {after}"
    )
    if sealed_found:
        failures.append("sealed turns were found by search")
    if kept_found < len(kept_texts) * 0.8:  # a short text ("Bye!") may rank below its twins
        failures.append("turns before the seal were mostly not found")
    if len(opened.turns) != len(sealed_texts) or len(again.turns) != len(sealed_texts) + 1:
        failures.append("reopen did not return the sealed stretch")
    if after != "NOT_FOUND/RECORD_DELETED" or done.receipt.deleted != len(sealed_texts) + 1:
        failures.append("DESTROY left sealed material readable")
    return {
        "thread": thread,
        "from_seq": from_seq,
        "sealed": len(sealed_texts),
        "sealed_found_by_search": sealed_found,
        "kept_found": kept_found,
        "reopened_turns": len(again.turns),
        "destroyed": done.receipt.deleted,
        "get_after_destroy": after,
        "failures": failures,
    }


def _print_scores(
    per_mode: dict[str, Any], latency: dict[str, Any], dropped: int, empty: int
) -> None:
    print(
        f"\nrecall of evidence dialog ids (Search over gRPC, top-{max(KS)}); "
        f"{dropped} malformed evidence references dropped, {empty} items without evidence"
    )
    print("\nHYBRID (the default mode), by category, all conversations:")
    header = f"{'category':<16}{'items':>6}" + "".join(f"{'R@' + str(k):>8}" for k in KS)
    header += "".join(f"{'hit@' + str(k):>8}" for k in (1, 10))
    print(header)
    for group, e in per_mode["HYBRID"]["all"].items():
        row = f"{group:<16}{e['items']:>6}" + "".join(f"{e[f'recall@{k}']:>8.3f}" for k in KS)
        row += "".join(f"{e[f'hit@{k}']:>8.3f}" for k in (1, 10))
        print(row)
    print("\nevery mode, categories 1-4, by split:")
    print(f"{'mode':<9}{'split':<22}{'items':>6}" + "".join(f"{'R@' + str(k):>8}" for k in KS))
    for mode, splits in per_mode.items():
        for split, groups in splits.items():
            e = groups.get("overall (1-4)")
            if e is None:
                continue
            print(
                f"{mode:<9}{split:<22}{e['items']:>6}"
                + "".join(f"{e[f'recall@{k}']:>8.3f}" for k in KS)
            )
    print("\nlatency (ms): " + ", ".join(f"{k}={v}" for k, v in latency.items()))
