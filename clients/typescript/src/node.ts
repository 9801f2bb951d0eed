// Transports for Node: gRPC (HTTP/2) to `lethe serve --listen`, or the Connect
// protocol (HTTP/1.1 or HTTP/2, binary or JSON) to `lethe serve
// --http-listen`; TLS with a CA and, for mutual TLS, a client certificate.
//
//   import { LetheClient } from "lethe-store-client";
//   import { createNodeTransport } from "lethe-store-client/node";
//   const lethe = new LetheClient({
//     token,
//     transport: createNodeTransport({ baseUrl: "http://127.0.0.1:50051", protocol: "grpc" }),
//   });

import type { Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";

/** TLS to the server: PEM text or bytes. */
export interface NodeTls {
  /** The CA that signed the server's certificate (default: the system's). */
  readonly ca?: string | Buffer;
  /** A client certificate chain and its key, for a server with `--client-ca`. */
  readonly cert?: string | Buffer;
  readonly key?: string | Buffer;
  /** The name to check the server's certificate against (default: the URL's host). */
  readonly servername?: string;
}

export interface NodeTransportOptions {
  /**
   * `http://host:port` or `https://host:port`: the gRPC listener
   * (`--listen`) for "grpc", the HTTP listener (`--http-listen`) for "connect".
   */
  readonly baseUrl: string;
  /** "connect" (default) or "grpc". */
  readonly protocol?: "connect" | "grpc";
  /** Connect only: "2" (default; h2c on plain http) or "1.1". */
  readonly httpVersion?: "1.1" | "2";
  /** Connect only: binary protobuf (default) or JSON. */
  readonly useBinaryFormat?: boolean;
  /** TLS options for an `https://` URL. */
  readonly tls?: NodeTls;
}

/** A transport to a Lethe server from Node: see `NodeTransportOptions`. */
export function createNodeTransport(options: NodeTransportOptions): Transport {
  const nodeOptions = { ...options.tls };
  if (options.protocol === "grpc") {
    return createGrpcTransport({ baseUrl: options.baseUrl, nodeOptions });
  }
  return createConnectTransport({
    baseUrl: options.baseUrl,
    httpVersion: options.httpVersion ?? "2",
    useBinaryFormat: options.useBinaryFormat ?? true,
    nodeOptions,
  });
}
