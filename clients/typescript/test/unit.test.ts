// LetheClient without a server: an in-memory transport (connect-es's router
// transport) stands in for Lethe, to check the routing header, the error
// classes and the resuming watch exactly.

import assert from "node:assert/strict";
import { test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createRouterTransport } from "@connectrpc/connect";
import {
  ErrorInfoSchema,
  RetryInfoSchema,
} from "../src/gen/google/rpc/error_details_pb.js";
import {
  Events,
  EventSchema,
  LetheClient,
  OwnerNotAllowed,
  PermissionDenied,
  RecordDeleted,
  Threads,
  TooManyRequests,
  ThreadSchema,
  requestOwner,
  toLetheError,
} from "../src/index.js";

function refusal(code: Code, reason: string, retryMs?: number): ConnectError {
  const details = [
    { desc: ErrorInfoSchema, value: { reason, domain: "lethe" } },
    ...(retryMs === undefined
      ? []
      : [
          {
            desc: RetryInfoSchema,
            value: { retryDelay: create(DurationSchema, { nanos: retryMs * 1e6 }) },
          },
        ]),
  ];
  return new ConnectError("refused", code, undefined, details);
}

test("the owner is read from the request's names, first match wins", () => {
  assert.equal(requestOwner({ parent: "owners/alice/threads/t" }), "alice");
  assert.equal(requestOwner({ name: "owners/bob/memories/m" }), "bob");
  assert.equal(requestOwner({ thread: "owners/carol/threads/t", query: "x" }), "carol");
  assert.equal(requestOwner({ memory: { name: "owners/dan/memories/m" } }), "dan");
  assert.equal(requestOwner({ names: ["owners/eve/threads/t/turns/1", "owners/x/y"] }), "eve");
  assert.equal(requestOwner({ range: { thread: "owners/fay/threads/t" } }), "fay");
  assert.equal(requestOwner({ parent: "threads/t" }), undefined);
  assert.equal(requestOwner({}), undefined);
});

test("every call carries the token and the owner header", async () => {
  const seen: Array<[string | null, string | null]> = [];
  const transport = createRouterTransport(({ service }) => {
    service(Threads, {
      getThread(request, context) {
        seen.push([context.requestHeader.get("authorization"), context.requestHeader.get("x-lethe-owner")]);
        return create(ThreadSchema, { name: request.name });
      },
    });
  });
  const lethe = new LetheClient({ token: "lethe_t", transport });
  const thread = await lethe.getThread({ name: "owners/alice/threads/t1" });
  assert.equal(thread.name, "owners/alice/threads/t1");
  assert.deepEqual(seen, [["Bearer lethe_t", "alice"]]);
});

test("errors become the class of their reason, with the retry delay in milliseconds", async () => {
  const transport = createRouterTransport(({ service }) => {
    service(Threads, {
      getThread(request) {
        if (request.name.endsWith("busy")) throw refusal(Code.ResourceExhausted, "TOO_MANY_REQUESTS", 100);
        if (request.name.endsWith("gone")) throw refusal(Code.NotFound, "RECORD_DELETED");
        throw refusal(Code.PermissionDenied, "OWNER_NOT_ALLOWED");
      },
    });
  });
  const lethe = new LetheClient({ token: "lethe_t", transport });
  await assert.rejects(lethe.getThread({ name: "owners/a/threads/busy" }), (error: unknown) => {
    assert.ok(error instanceof TooManyRequests);
    assert.equal(error.reason, "TOO_MANY_REQUESTS");
    assert.equal(error.code, Code.ResourceExhausted);
    assert.equal(error.retryDelay, 100);
    return true;
  });
  await assert.rejects(lethe.getThread({ name: "owners/a/threads/gone" }), RecordDeleted);
  await assert.rejects(lethe.getThread({ name: "owners/a/threads/x" }), (error: unknown) => {
    assert.ok(error instanceof OwnerNotAllowed);
    assert.ok(error instanceof PermissionDenied);
    return true;
  });
  // A reason that does not fit the code falls back to the code's class.
  const odd = toLetheError(refusal(Code.Internal, "RECORD_DELETED"));
  assert.equal(odd.constructor.name, "Internal");
  assert.equal(odd.reason, "RECORD_DELETED");
  // The details survive the wire's binary form too (gRPC's trailer).
  assert.ok(toBinary(ErrorInfoSchema, create(ErrorInfoSchema, { reason: "X" })).length > 0);
});

test("watch resumes after the last event when the stream ends UNAVAILABLE", async () => {
  const afters: string[] = [];
  const transport = createRouterTransport(({ service }) => {
    service(Events, {
      async *watch(request) {
        afters.push(request.after);
        const first = Number(request.after || "0") + 1;
        for (let id = first; id < first + 2; id++) {
          yield create(EventSchema, { id: String(id), subject: `owners/a/threads/t/turns/${id}` });
        }
        if (first < 5) throw refusal(Code.Unavailable, "DRAINING");
      },
    });
  });
  const lethe = new LetheClient({ token: "lethe_t", transport });
  const ids: string[] = [];
  for await (const event of lethe.watch({ parent: "owners/a" }, { resumeDelayMs: 1 })) {
    ids.push(event.id);
  }
  assert.deepEqual(ids, ["1", "2", "3", "4", "5", "6"]);
  assert.deepEqual(afters, ["", "2", "4"]);
});

test("watch gives up after maxResumes, and never resumes other errors", async () => {
  let opened = 0;
  const transport = createRouterTransport(({ service }) => {
    service(Events, {
      // eslint-disable-next-line require-yield
      async *watch(request) {
        opened += 1;
        if (request.parent === "owners/denied") throw refusal(Code.PermissionDenied, "OWNER_NOT_ALLOWED");
        throw refusal(Code.Unavailable, "DRAINING");
      },
    });
  });
  const lethe = new LetheClient({ token: "lethe_t", transport });
  const drain = async (parent: string) => {
    for await (const _ of lethe.watch({ parent }, { maxResumes: 2, resumeDelayMs: 1 })) {
      void _;
    }
  };
  await assert.rejects(drain("owners/a"), (error: unknown) => error instanceof Error && error.name === "Draining");
  assert.equal(opened, 3);
  await assert.rejects(drain("owners/denied"), OwnerNotAllowed);
  assert.equal(opened, 4);
});
