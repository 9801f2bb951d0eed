// LetheClient against a real `lethe serve`, over the transport the environment
// names (tests/crosslang/test_typescript_client.py runs it once per transport):
//
//   LETHE_TRANSPORT  grpc | connect-json (Node, HTTP/1.1) | connect-binary (Node,
//                    HTTP/2) | fetch-json | fetch-binary (connect-web, as a
//                    browser or an edge runtime calls it)
//   LETHE_URL        http(s)://host:port of the listener (gRPC's or HTTP's)
//   LETHE_TOKEN      a token for LETHE_OWNER only
//   LETHE_OWNER      the owner to work on; LETHE_STRANGER another owner
//   LETHE_CA         PEM file of the CA of a TLS server
//
// The server runs with --require-owner-header (every call must carry the
// owner header) and --max-streams-per-principal 1 (a second Watch is refused
// with TOO_MANY_STREAMS and a retry delay).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import type { Transport } from "@connectrpc/connect";
import {
  EventType,
  LetheClient,
  OwnerNotAllowed,
  RecordDeleted,
  Role,
  State,
  TooManyStreams,
  createConnectTransport,
} from "../src/index.js";
import { createNodeTransport } from "../src/node.js";

// Without a server to call (plain `npm test`), these tests are skipped.
const configured = Boolean(process.env.LETHE_URL);
const serverTest = configured ? test : test.skip;
const env = (name: string): string => process.env[name] ?? "";
const KIND = env("LETHE_TRANSPORT");
const URL_ = env("LETHE_URL");
const OWNER = env("LETHE_OWNER");
const STRANGER = env("LETHE_STRANGER");
const CA = process.env.LETHE_CA ? readFileSync(process.env.LETHE_CA) : undefined;

function transport(): Transport {
  if (!configured) return createConnectTransport({ baseUrl: "http://localhost" });
  const tls = CA ? { ca: CA } : undefined;
  switch (KIND) {
    case "grpc":
      return createNodeTransport({ baseUrl: URL_, protocol: "grpc", tls });
    case "connect-json":
      return createNodeTransport({ baseUrl: URL_, httpVersion: "1.1", useBinaryFormat: false, tls });
    case "connect-binary":
      return createNodeTransport({ baseUrl: URL_, httpVersion: "2", useBinaryFormat: true, tls });
    case "fetch-json":
    case "fetch-binary":
      // connect-web's transport on the global fetch, as in a browser (TLS: NODE_EXTRA_CA_CERTS).
      return createConnectTransport({ baseUrl: URL_, useBinaryFormat: KIND === "fetch-binary" });
    default:
      throw new Error(`unknown LETHE_TRANSPORT ${KIND}`);
  }
}

const lethe = new LetheClient({ token: env("LETHE_TOKEN"), transport: transport(), timeoutMs: 20_000 });
const parent = `owners/${OWNER}`;

serverTest("create, append, commit, search, forget; a Watch sees the deletion", async () => {
  const thread = await lethe.createThread({ parent, title: `over ${KIND}` });
  assert.ok(thread.name.startsWith(`${parent}/threads/`));
  const { turns } = await lethe.appendTurns({
    parent: thread.name,
    turns: [
      { role: Role.USER, text: "I adopted a puppy called Biscuit" },
      { role: Role.USER, text: "I also started learning the cello" },
    ],
  });
  assert.deepEqual(turns.map((t) => t.state), [State.PENDING, State.PENDING]);
  assert.equal((await lethe.search({ parent, queryText: "puppy" })).hits.length, 0);
  const committed = await lethe.commit({ names: turns.map((t) => t.name) });
  assert.equal(committed.committed.length, 2);
  const found = await lethe.search({ parent, queryText: "puppy Biscuit", topK: 5 });
  assert.equal(found.hits[0]?.record.case, "turn");
  assert.equal(found.hits[0]?.record.value?.name, turns[0]!.name);

  const stop = new AbortController();
  const events = lethe.watch({ parent, types: [EventType.RECORD_DELETED] }, { signal: stop.signal });
  const first = events.next();
  const receipt = await lethe.forget({ names: [turns[0]!.name], reason: "asked to" });
  assert.deepEqual(receipt.targets, [turns[0]!.name]);
  const event = await first;
  assert.equal(event.done, false);
  assert.equal(event.value?.subject, turns[0]!.name);
  assert.equal(event.value?.type, EventType.RECORD_DELETED);
  stop.abort();
  assert.equal((await events.next()).done, true);

  const after = await lethe.search({ parent, queryText: "puppy Biscuit" });
  assert.ok(!after.hits.some((h) => h.record.value?.name === turns[0]!.name));
  await assert.rejects(lethe.getTurn({ name: turns[0]!.name }), RecordDeleted);
});

serverTest("page iterators follow every page", async () => {
  const thread = await lethe.createThread({ parent });
  const texts = ["one", "two", "three", "four", "five"];
  await lethe.appendTurns({ parent: thread.name, turns: texts.map((text) => ({ role: Role.USER, text })) });
  const listed: string[] = [];
  for await (const turn of lethe.iterTurns({ parent: thread.name, pageSize: 2, states: [State.PENDING] })) {
    listed.push(turn.text);
  }
  assert.deepEqual(listed, texts);
  const threads: string[] = [];
  for await (const t of lethe.iterThreads({ parent, pageSize: 1 })) threads.push(t.name);
  assert.ok(threads.includes(thread.name));
});

serverTest("a receipt names its store and key; an export reads back whole", async () => {
  const info = await lethe.getServerInfo();
  assert.ok(info.storeId.length > 0);
  assert.ok(info.receiptKeys.length >= 1);
  const thread = await lethe.createThread({ parent });
  const { turns } = await lethe.appendTurns({ parent: thread.name, turns: [{ role: Role.USER, text: "exported", commit: true }] });
  const receipt = await lethe.forget({ names: [turns[0]!.name] });
  assert.equal(receipt.storeId, info.storeId);
  assert.ok(info.receiptKeys.some((k) => k.keyId === receipt.signingKeyId));
  assert.equal(receipt.signature.length, 64); // Ed25519
  // The export is a stream: the previous test's Watch may hold the token's one stream a moment.
  for (let attempt = 0; ; attempt++) {
    try {
      const kinds: (string | undefined)[] = [];
      for await (const item of lethe.exportOwner({ parent })) kinds.push(item.item.case);
      assert.equal(kinds[0], "header");
      assert.equal(kinds.at(-1), "summary");
      assert.ok(kinds.includes("receipt"));
      break;
    } catch (error) {
      if (!(error instanceof TooManyStreams) || attempt > 50) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
});

serverTest("a refused call carries its reason and retry delay", async () => {
  // One Watch is open (the server allows one per token); a second is refused.
  const stop = new AbortController();
  let open: AsyncGenerator<unknown>;
  // The history replays at once: its first event shows this stream is admitted
  // (the previous test's stream may take a moment to be let go).
  for (let attempt = 0; ; attempt++) {
    open = lethe.watch({ parent }, { signal: stop.signal, maxResumes: 0 });
    try {
      assert.equal((await open.next()).done, false);
      break;
    } catch (error) {
      if (!(error instanceof TooManyStreams) || attempt > 50) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  try {
    const second = lethe.watch({ parent }, { maxResumes: 0 });
    await assert.rejects(second.next(), (error: unknown) => {
      assert.ok(error instanceof TooManyStreams, String(error));
      assert.equal(error.reason, "TOO_MANY_STREAMS");
      assert.equal(error.retryDelay, 1000);
      return true;
    });
  } finally {
    stop.abort();
    await open.return(undefined);
  }
});

serverTest("another owner's data is refused", async () => {
  await assert.rejects(lethe.search({ parent: `owners/${STRANGER}`, queryText: "puppy" }), (error: unknown) => {
    assert.ok(error instanceof OwnerNotAllowed, String(error));
    assert.equal(error.reason, "OWNER_NOT_ALLOWED");
    return true;
  });
});
