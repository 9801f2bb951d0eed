// LetheClient: one method per RPC of the lethe.v1 services, over any
// connect-es transport — Connect (browsers, edge runtimes, Node) or gRPC
// (Node, `lethe-store-client/node`).
//
// Every call carries `authorization: Bearer <token>` and the routing header
// `x-lethe-owner: <owner>`, the owner read from the request's resource names
// (first match: parent, name, thread, memory.name, names[0], range.thread —
// the same rule as the Python client), so a sharding proxy routes it to the
// owner's shard. Failures are thrown as LetheError subclasses (./errors.ts).
// The list methods have page iterators (`iterThreads`, ...); `watch` resumes
// after the last event it delivered when the stream breaks (a draining
// server, a proxy or network failure).

import type { DescMessage, MessageInitShape } from "@bufbuild/protobuf";
import { Code, type CallOptions, type Client, type Transport, createClient } from "@connectrpc/connect";
import { Draining, type LetheError, Unavailable, toLetheError } from "./errors.js";
import { type Event, Events, type WatchRequestSchema } from "./gen/lethe/v1/events_pb.js";
import { Lifecycle } from "./gen/lethe/v1/lifecycle_pb.js";
import type {
  AuditRequestSchema,
  AuditReport,
  CommitRequestSchema,
  CommitResponse,
  ExportItem,
  ExportOwnerRequestSchema,
  ExtendPendingRequestSchema,
  ExtendPendingResponse,
  ForgetRequestSchema,
  GetServerInfoRequestSchema,
  GetLineageRequestSchema,
  GetLineageResponse,
  ListDeletionsRequestSchema,
  ListDeletionsResponse,
  ServerInfo,
  SetRetentionRequestSchema,
  SetRetentionResponse,
} from "./gen/lethe/v1/lifecycle_pb.js";
import type { DeletionReceipt } from "./gen/lethe/v1/common_pb.js";
import { Memories } from "./gen/lethe/v1/memories_pb.js";
import type {
  BatchUpdateMemoriesRequestSchema,
  BatchUpdateMemoriesResponse,
  CreateMemoryRequestSchema,
  GetMemoryRequestSchema,
  ListMemoriesRequestSchema,
  ListMemoriesResponse,
  Memory,
  ResolvePreferenceRequestSchema,
  ResolvePreferenceResponse,
  TransitionMemoryRequestSchema,
  UpdateMemoryRequestSchema,
} from "./gen/lethe/v1/memories_pb.js";
import { Repairs } from "./gen/lethe/v1/repairs_pb.js";
import type {
  ConcludeRepairRequestSchema,
  ConcludeRepairResponse,
  PauseRepairRequestSchema,
  ReopenRepairRequestSchema,
  ReopenRepairResponse,
  SealRepairRequestSchema,
} from "./gen/lethe/v1/repairs_pb.js";
import { Retrieval } from "./gen/lethe/v1/retrieval_pb.js";
import type {
  AssembleContextRequestSchema,
  ContextBundle,
  ContextManifest,
  GetContextManifestRequestSchema,
  SearchRequestSchema,
  SearchResponse,
} from "./gen/lethe/v1/retrieval_pb.js";
import { Threads } from "./gen/lethe/v1/threads_pb.js";
import type {
  AppendTurnsRequestSchema,
  AppendTurnsResponse,
  CreateThreadRequestSchema,
  GetThreadRequestSchema,
  GetTurnRequestSchema,
  ListThreadsRequestSchema,
  ListThreadsResponse,
  ListTurnsRequestSchema,
  ListTurnsResponse,
  Thread,
  Turn,
} from "./gen/lethe/v1/threads_pb.js";

/** The metadata a sharding proxy routes every call on (`lethe.names.OWNER_HEADER`). */
export const OWNER_HEADER = "x-lethe-owner";

/** A request of the method whose request message is `S`, as a plain object. */
export type Request<S extends DescMessage> = MessageInitShape<S>;

/** How a `LetheClient` reaches the server. */
export interface LetheClientOptions {
  /** The bearer token (`lethe token create`). */
  readonly token: string;
  /**
   * A connect-es transport: `createConnectTransport` (from
   * `@connectrpc/connect-web` for browsers and edge runtimes), or, in Node,
   * `createNodeTransport` from `lethe-store-client/node` (gRPC or Connect,
   * HTTP/1.1 or HTTP/2, TLS).
   */
  readonly transport: Transport;
  /** The deadline of each unary call, in milliseconds (none by default; `watch` has none). */
  readonly timeoutMs?: number;
}

/** How `watch` resumes. */
export interface WatchOptions extends CallOptions {
  /**
   * Resume after the last delivered event when the stream ends with
   * UNAVAILABLE (a draining server, a proxy, the network): at most this many
   * times in a row (default 10; 0: never).
   */
  readonly maxResumes?: number;
  /** Milliseconds before the first resume (doubled each time, at most 5 s; default 100). */
  readonly resumeDelayMs?: number;
}

/** The owner id a request's resource names start with, or undefined (see the file's comment). */
export function requestOwner(request: object): string | undefined {
  const r = request as Record<string, unknown>;
  for (const field of ["parent", "name", "thread"]) {
    const value = r[field];
    if (typeof value === "string" && value !== "") {
      return ownerOf(value);
    }
  }
  const memory = r["memory"] as { name?: unknown } | undefined;
  if (typeof memory?.name === "string" && memory.name !== "") {
    return ownerOf(memory.name);
  }
  const names = r["names"];
  if (Array.isArray(names) && typeof names[0] === "string") {
    return ownerOf(names[0]);
  }
  const range = r["range"] as { thread?: unknown } | undefined;
  if (typeof range?.thread === "string" && range.thread !== "") {
    return ownerOf(range.thread);
  }
  return undefined;
}

function ownerOf(name: string): string | undefined {
  const parts = name.split("/");
  return parts[0] === "owners" && parts[1] ? parts[1] : undefined;
}

/** A typed client of Lethe: see the file's comment. */
export class LetheClient {
  readonly #token: string;
  readonly #timeoutMs: number | undefined;
  readonly #threads: Client<typeof Threads>;
  readonly #memories: Client<typeof Memories>;
  readonly #retrieval: Client<typeof Retrieval>;
  readonly #lifecycle: Client<typeof Lifecycle>;
  readonly #repairs: Client<typeof Repairs>;
  readonly #events: Client<typeof Events>;

  constructor(options: LetheClientOptions) {
    this.#token = options.token;
    this.#timeoutMs = options.timeoutMs;
    const transport = options.transport;
    this.#threads = createClient(Threads, transport);
    this.#memories = createClient(Memories, transport);
    this.#retrieval = createClient(Retrieval, transport);
    this.#lifecycle = createClient(Lifecycle, transport);
    this.#repairs = createClient(Repairs, transport);
    this.#events = createClient(Events, transport);
  }

  /** The call options of `request`: the token, the owner header, the default deadline of a unary call. */
  callOptions(request: object, options: CallOptions = {}, stream = false): CallOptions {
    const headers = new Headers(options.headers);
    headers.set("authorization", `Bearer ${this.#token}`);
    const owner = requestOwner(request);
    if (owner !== undefined) {
      headers.set(OWNER_HEADER, owner);
    }
    return { timeoutMs: stream ? undefined : this.#timeoutMs, ...options, headers };
  }

  async #call<I extends object, O>(
    method: (request: I, options?: CallOptions) => Promise<O>,
    request: I,
    options?: CallOptions,
  ): Promise<O> {
    try {
      return await method(request, this.callOptions(request, options));
    } catch (error) {
      throw toLetheError(error);
    }
  }

  // -- lethe.v1.Threads ------------------------------------------------------------

  createThread(request: Request<typeof CreateThreadRequestSchema>, options?: CallOptions): Promise<Thread> {
    return this.#call(this.#threads.createThread, request, options);
  }
  getThread(request: Request<typeof GetThreadRequestSchema>, options?: CallOptions): Promise<Thread> {
    return this.#call(this.#threads.getThread, request, options);
  }
  listThreads(request: Request<typeof ListThreadsRequestSchema>, options?: CallOptions): Promise<ListThreadsResponse> {
    return this.#call(this.#threads.listThreads, request, options);
  }
  appendTurns(request: Request<typeof AppendTurnsRequestSchema>, options?: CallOptions): Promise<AppendTurnsResponse> {
    return this.#call(this.#threads.appendTurns, request, options);
  }
  listTurns(request: Request<typeof ListTurnsRequestSchema>, options?: CallOptions): Promise<ListTurnsResponse> {
    return this.#call(this.#threads.listTurns, request, options);
  }
  getTurn(request: Request<typeof GetTurnRequestSchema>, options?: CallOptions): Promise<Turn> {
    return this.#call(this.#threads.getTurn, request, options);
  }

  // -- lethe.v1.Memories -----------------------------------------------------------

  createMemory(request: Request<typeof CreateMemoryRequestSchema>, options?: CallOptions): Promise<Memory> {
    return this.#call(this.#memories.createMemory, request, options);
  }
  getMemory(request: Request<typeof GetMemoryRequestSchema>, options?: CallOptions): Promise<Memory> {
    return this.#call(this.#memories.getMemory, request, options);
  }
  listMemories(request: Request<typeof ListMemoriesRequestSchema>, options?: CallOptions): Promise<ListMemoriesResponse> {
    return this.#call(this.#memories.listMemories, request, options);
  }
  updateMemory(request: Request<typeof UpdateMemoryRequestSchema>, options?: CallOptions): Promise<Memory> {
    return this.#call(this.#memories.updateMemory, request, options);
  }
  /** Up to 1000 `UpdateMemory` requests of one owner, written all or none. */
  batchUpdateMemories(
    request: Request<typeof BatchUpdateMemoriesRequestSchema>,
    options?: CallOptions,
  ): Promise<BatchUpdateMemoriesResponse> {
    return this.#call(this.#memories.batchUpdateMemories, request, options);
  }
  transitionMemory(request: Request<typeof TransitionMemoryRequestSchema>, options?: CallOptions): Promise<Memory> {
    return this.#call(this.#memories.transitionMemory, request, options);
  }
  resolvePreference(
    request: Request<typeof ResolvePreferenceRequestSchema>,
    options?: CallOptions,
  ): Promise<ResolvePreferenceResponse> {
    return this.#call(this.#memories.resolvePreference, request, options);
  }

  // -- lethe.v1.Retrieval ----------------------------------------------------------

  search(request: Request<typeof SearchRequestSchema>, options?: CallOptions): Promise<SearchResponse> {
    return this.#call(this.#retrieval.search, request, options);
  }
  assembleContext(request: Request<typeof AssembleContextRequestSchema>, options?: CallOptions): Promise<ContextBundle> {
    return this.#call(this.#retrieval.assembleContext, request, options);
  }
  getContextManifest(
    request: Request<typeof GetContextManifestRequestSchema>,
    options?: CallOptions,
  ): Promise<ContextManifest> {
    return this.#call(this.#retrieval.getContextManifest, request, options);
  }

  // -- lethe.v1.Lifecycle ----------------------------------------------------------

  commit(request: Request<typeof CommitRequestSchema>, options?: CallOptions): Promise<CommitResponse> {
    return this.#call(this.#lifecycle.commit, request, options);
  }
  extendPending(request: Request<typeof ExtendPendingRequestSchema>, options?: CallOptions): Promise<ExtendPendingResponse> {
    return this.#call(this.#lifecycle.extendPending, request, options);
  }
  forget(request: Request<typeof ForgetRequestSchema>, options?: CallOptions): Promise<DeletionReceipt> {
    return this.#call(this.#lifecycle.forget, request, options);
  }
  getLineage(request: Request<typeof GetLineageRequestSchema>, options?: CallOptions): Promise<GetLineageResponse> {
    return this.#call(this.#lifecycle.getLineage, request, options);
  }
  listDeletions(request: Request<typeof ListDeletionsRequestSchema>, options?: CallOptions): Promise<ListDeletionsResponse> {
    return this.#call(this.#lifecycle.listDeletions, request, options);
  }
  audit(request: Request<typeof AuditRequestSchema>, options?: CallOptions): Promise<AuditReport> {
    return this.#call(this.#lifecycle.audit, request, options);
  }
  /** `Lifecycle.GetServerInfo`: the store's id and every public key that signs its receipts. */
  getServerInfo(request: Request<typeof GetServerInfoRequestSchema> = {}, options?: CallOptions): Promise<ServerInfo> {
    return this.#call(this.#lifecycle.getServerInfo, request, options);
  }
  setRetention(request: Request<typeof SetRetentionRequestSchema>, options?: CallOptions): Promise<SetRetentionResponse> {
    return this.#call(this.#lifecycle.setRetention, request, options);
  }
  /**
   * `Lifecycle.ExportOwner`: everything of `request.parent` the token may read, item
   * after item (a header first, a counting summary last). Unlike `watch` it does not
   * resume: a broken export is incomplete, and is started again.
   */
  async *exportOwner(request: Request<typeof ExportOwnerRequestSchema>, options: CallOptions = {}): AsyncGenerator<ExportItem> {
    try {
      yield* this.#lifecycle.exportOwner(request, this.callOptions(request, options, true));
    } catch (error) {
      throw toLetheError(error);
    }
  }

  // -- lethe.v1.Repairs ------------------------------------------------------------

  sealRepair(request: Request<typeof SealRepairRequestSchema>, options?: CallOptions): Promise<Thread> {
    return this.#call(this.#repairs.sealRepair, request, options);
  }
  reopenRepair(request: Request<typeof ReopenRepairRequestSchema>, options?: CallOptions): Promise<ReopenRepairResponse> {
    return this.#call(this.#repairs.reopenRepair, request, options);
  }
  pauseRepair(request: Request<typeof PauseRepairRequestSchema>, options?: CallOptions): Promise<Thread> {
    return this.#call(this.#repairs.pauseRepair, request, options);
  }
  concludeRepair(
    request: Request<typeof ConcludeRepairRequestSchema>,
    options?: CallOptions,
  ): Promise<ConcludeRepairResponse> {
    return this.#call(this.#repairs.concludeRepair, request, options);
  }

  // -- lethe.v1.Events -------------------------------------------------------------

  /**
   * `Events.Watch`: the owner's events after `request.after`, then new ones as
   * they happen, until `options.signal` aborts (the iteration then ends) or
   * an error that is not UNAVAILABLE. After an UNAVAILABLE end (a draining
   * server, a proxy or network failure) the stream is opened again after the
   * last event delivered, so no event is missed or repeated.
   */
  async *watch(request: Request<typeof WatchRequestSchema>, options: WatchOptions = {}): AsyncGenerator<Event> {
    const { maxResumes = 10, resumeDelayMs = 100, ...call } = options;
    let after = request.after ?? "";
    let failures = 0;
    for (;;) {
      const current = { ...request, after };
      try {
        for await (const event of this.#events.watch(current, this.callOptions(current, call, true))) {
          failures = 0;
          after = event.id;
          yield event;
        }
        return;
      } catch (error) {
        const failure = toLetheError(error);
        if (call.signal?.aborted || failure.code === Code.Canceled) {
          return;
        }
        if (!(failure instanceof Unavailable) || failures >= maxResumes) {
          throw failure;
        }
        failures += 1;
        const backoff = Math.min(resumeDelayMs * 2 ** (failures - 1), 5000);
        await sleep(failure instanceof Draining ? Math.max(backoff, 200) : backoff, call.signal);
      }
    }
  }

  // -- page iterators --------------------------------------------------------------

  /** Every thread of `request.parent`, page after page. */
  iterThreads(request: Request<typeof ListThreadsRequestSchema>, options?: CallOptions): AsyncGenerator<Thread> {
    return pages(request, (page) => this.listThreads(page, options), (r) => r.threads);
  }
  /** Every turn of `request.parent` (a thread), page after page. */
  iterTurns(request: Request<typeof ListTurnsRequestSchema>, options?: CallOptions): AsyncGenerator<Turn> {
    return pages(request, (page) => this.listTurns(page, options), (r) => r.turns);
  }
  /** Every memory of `request.parent` that the filters keep, page after page. */
  iterMemories(request: Request<typeof ListMemoriesRequestSchema>, options?: CallOptions): AsyncGenerator<Memory> {
    return pages(request, (page) => this.listMemories(page, options), (r) => r.memories);
  }
  /** Every deletion receipt of `request.parent`, page after page. */
  iterDeletions(
    request: Request<typeof ListDeletionsRequestSchema>,
    options?: CallOptions,
  ): AsyncGenerator<DeletionReceipt> {
    return pages(request, (page) => this.listDeletions(page, options), (r) => r.receipts);
  }
}

async function* pages<I extends { pageToken?: string }, O extends { nextPageToken: string }, T>(
  request: I,
  list: (request: I) => Promise<O>,
  items: (response: O) => T[],
): AsyncGenerator<T> {
  let token = request.pageToken ?? "";
  do {
    const response = await list({ ...request, pageToken: token });
    yield* items(response);
    token = response.nextPageToken;
  } while (token !== "");
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}

export type { LetheError };
