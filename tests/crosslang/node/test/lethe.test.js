// A Node.js client of Lethe, as another team would write it: @grpc/grpc-js
// and @grpc/proto-loader loading ../../../proto directly (no generated code),
// google-proto-files for google/rpc/status.proto and error_details.proto.
//
//   LETHE_TARGET  host:port of a serving lethe (required)
//   LETHE_TOKEN   a bearer token allowed for LETHE_OWNER (required)
//   LETHE_OWNER   the owner to work on (default "node-interop")
//   LETHE_CA      PEM file of the CA of a TLS server; then the token goes as
//                 call credentials, as gRPC means it to
//
// What a Node developer has to know (docs/other-languages.md):
// - proto-loader renames fields to camelCase unless `keepCase: true`, and
//   silently drops request keys it does not know (query_text vs queryText).
// - int64 fields (seq, version, counts) arrive as Long objects unless
//   `longs: String` (or Number) is set; here they are strings.
// - proto3 drops fields at their zero value from the wire; without
//   `defaults: true` they are missing (undefined) instead of false/0/"".
// - enums arrive as numbers unless `enums: String`.
// - error details (google.rpc.Status in the `grpc-status-details-bin`
//   trailer) are not decoded by grpc-js: decode them with the google/rpc
//   protos, then each Any by its type URL.
// - call credentials need a secure channel: over plaintext, send the
//   `authorization` metadata yourself.

'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');
const googleProtos = require('google-proto-files');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', '..', '..', 'proto');
const GOOGLE_ROOT = path.resolve(googleProtos.getProtoPath(), '..');
const TARGET = process.env.LETHE_TARGET;
const TOKEN = process.env.LETHE_TOKEN;
const OWNER = process.env.LETHE_OWNER || 'node-interop';
const CA = process.env.LETHE_CA;

if (!TARGET || !TOKEN) {
  throw new Error('set LETHE_TARGET and LETHE_TOKEN');
}

const definition = protoLoader.loadSync(
  [
    ...['threads', 'memories', 'retrieval', 'lifecycle', 'events'].map((f) => `lethe/v1/${f}.proto`),
    'lethe/errors/v1/errors.proto',
  ],
  {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  },
);
const api = grpc.loadPackageDefinition(definition).lethe.v1;

// google.rpc.Status and its details, to read the ErrorInfo reason.
const rpcRoot = new protobuf.Root();
rpcRoot.resolvePath = (origin, target) => {
  for (const dir of [GOOGLE_ROOT, PROTO_ROOT]) {
    const candidate = path.join(dir, target);
    if (fs.existsSync(candidate)) return candidate;
  }
  return protobuf.util.path.resolve(origin, target);
};
rpcRoot.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
const Status = rpcRoot.lookupType('google.rpc.Status');
const ErrorInfo = rpcRoot.lookupType('google.rpc.ErrorInfo');

function channelCredentials() {
  if (!CA) return { creds: grpc.credentials.createInsecure(), md: bearer() };
  const callCreds = grpc.credentials.createFromMetadataGenerator((_params, callback) =>
    callback(null, bearer()),
  );
  const creds = grpc.credentials.combineChannelCredentials(
    grpc.credentials.createSsl(fs.readFileSync(CA)),
    callCreds,
  );
  return { creds, md: new grpc.Metadata() };
}

function bearer() {
  const md = new grpc.Metadata();
  md.set('authorization', `Bearer ${TOKEN}`);
  return md;
}

const { creds, md } = channelCredentials();
const threads = new api.Threads(TARGET, creds);
const lifecycle = new api.Lifecycle(TARGET, creds);
const retrieval = new api.Retrieval(TARGET, creds);
const events = new api.Events(TARGET, creds);

function call(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, md, { deadline: Date.now() + 10000 }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
  });
}

/** The ErrorInfo {reason, domain} of a failed call, or null. */
function errorInfo(err) {
  const raw = err.metadata && err.metadata.get('grpc-status-details-bin')[0];
  if (!raw) return null;
  const status = Status.decode(raw);
  for (const any of status.details) {
    if (any.type_url.endsWith('/google.rpc.ErrorInfo')) {
      const info = ErrorInfo.decode(any.value);
      return { reason: info.reason, domain: info.domain };
    }
  }
  return null;
}

async function refusal(promise) {
  try {
    await promise;
  } catch (err) {
    return { code: err.code, ...errorInfo(err) };
  }
  assert.fail('the call succeeded');
}

test('create, append, commit, search, watch, forget, and read refusals', async () => {
  const word = `nodeplant${crypto.randomBytes(6).toString('hex')}`;
  const thread = await call(threads, 'CreateThread', {
    parent: `owners/${OWNER}`,
    title: 'node interop',
  });
  assert.match(thread.name, new RegExp(`^owners/${OWNER}/threads/`));
  assert.equal(thread.last_seq, '0'); // int64 as a string; 0 present thanks to defaults

  const appended = await call(threads, 'AppendTurns', {
    parent: thread.name,
    turns: [
      { role: 'USER', text: `my ${word} is a golden retriever`, commit: true },
      { role: 'USER', text: 'this one waits' },
    ],
  });
  const [kept, waiting] = appended.turns;
  assert.equal(kept.seq, '1');
  assert.equal(kept.state, 'COMMITTED');
  assert.equal(waiting.state, 'PENDING');
  assert.equal(waiting.tainted, false);

  const committed = await call(lifecycle, 'Commit', { names: [waiting.name] });
  assert.deepEqual(
    committed.committed.map((r) => r.name),
    [waiting.name],
  );

  const found = await call(retrieval, 'Search', {
    parent: `owners/${OWNER}`,
    query_text: word,
    top_k: 5,
  });
  assert.equal(found.hits[0].record, 'turn');
  assert.equal(found.hits[0].turn.name, kept.name);
  assert.ok(found.hits[0].turn.text.includes(word));

  // A Watch stream opened before the forget sees its RECORD_DELETED event.
  const stream = events.Watch({ parent: `owners/${OWNER}`, types: ['RECORD_DELETED'] }, md);
  const deleted = new Promise((resolve, reject) => {
    stream.on('data', (event) => {
      if (event.subject === kept.name) resolve(event);
    });
    stream.on('error', (err) => {
      if (err.code !== grpc.status.CANCELLED) reject(err);
    });
  });
  await new Promise((r) => setTimeout(r, 200)); // let the stream open before the forget
  const receipt = await call(lifecycle, 'Forget', { names: [kept.name] });
  assert.deepEqual(receipt.targets, [kept.name]);
  const event = await deleted;
  assert.equal(event.type, 'RECORD_DELETED');
  stream.cancel();

  const gone = await refusal(call(threads, 'GetTurn', { name: kept.name }));
  assert.deepEqual(gone, { code: grpc.status.NOT_FOUND, reason: 'RECORD_DELETED', domain: 'lethe' });

  const foreign = await refusal(call(threads, 'ListThreads', { parent: 'owners/someone-else' }));
  assert.deepEqual(foreign, {
    code: grpc.status.PERMISSION_DENIED,
    reason: 'OWNER_NOT_ALLOWED',
    domain: 'lethe',
  });
  const bad = await refusal(call(threads, 'GetTurn', { name: 'not a name' }));
  assert.equal(bad.code, grpc.status.INVALID_ARGUMENT);
  assert.equal(bad.reason, 'BAD_FIELD');

  for (const client of [threads, lifecycle, retrieval, events]) client.close();
});
