// lethe-store-client: a typed client of Lethe for browsers, edge runtimes and
// Node. `LetheClient` takes any connect-es transport; `createConnectTransport`
// (re-exported from @connectrpc/connect-web) calls a `lethe serve
// --http-listen` over the Connect protocol with `fetch`. In Node,
// `lethe-store-client/node` makes gRPC and HTTP/2 transports with TLS.
//
//   const lethe = new LetheClient({
//     token,
//     transport: createConnectTransport({ baseUrl: "https://lethe.example:8080" }),
//   });
//   const thread = await lethe.createThread({ parent: "owners/alice" });

export { createConnectTransport } from "@connectrpc/connect-web";
export { Code, ConnectError } from "@connectrpc/connect";
export * from "./client.js";
export * from "./errors.js";
export * from "./gen/lethe/v1/common_pb.js";
export * from "./gen/lethe/v1/events_pb.js";
export * from "./gen/lethe/v1/lifecycle_pb.js";
export * from "./gen/lethe/v1/memories_pb.js";
export * from "./gen/lethe/v1/repairs_pb.js";
export * from "./gen/lethe/v1/retrieval_pb.js";
export * from "./gen/lethe/v1/threads_pb.js";
export { ErrorReason } from "./gen/lethe/errors/v1/errors_pb.js";
