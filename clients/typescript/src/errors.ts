// Lethe's errors as classes: one per status code, and one per documented
// reason (the google.rpc.ErrorInfo reason of domain "lethe" the server
// attaches), so callers catch `RecordDeleted` or `TooManyRequests` instead of
// comparing codes and strings. The same tree as the Python client's
// (lethe.client), over either transport: gRPC carries the details in the
// `grpc-status-details-bin` trailer, Connect in its error JSON; connect-es
// reads both into ConnectError.details.
//
//   LetheError                 (any code; `reason` "" when none was attached)
//   ├── InvalidArgument        BadField, DimensionMismatch, MalformedRequest,
//   │                          OwnerHeaderMismatch, OwnerHeaderMissing
//   ├── NotFound               RecordDeleted
//   ├── AlreadyExists          SlotConflict
//   ├── PermissionDenied       OwnerNotAllowed
//   ├── Unauthenticated        MissingToken, InvalidToken
//   ├── ResourceExhausted      StoreFull, TooManyRequests, TooManyStreams
//   ├── FailedPrecondition     SourceDeleted, SourceStale, SourceSealed,
//   │                          SourcePending, IllegalTransition,
//   │                          RepairNotContinued, Restricted, Sealed, OwnerMoved,
//   │                          EchoesForgotten
//   ├── Aborted                VersionMismatch
//   ├── Unavailable            StorageUnavailable, Draining, ShardUnavailable,
//   │                          OwnerMoving
//   ├── DataLoss               Integrity
//   └── Cancelled, Unknown, DeadlineExceeded, OutOfRange, Unimplemented, Internal

import { Code, ConnectError } from "@connectrpc/connect";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  PreconditionFailureSchema,
  RetryInfoSchema,
} from "./gen/google/rpc/error_details_pb.js";

/** The `ErrorInfo.domain` of every reason the Lethe server attaches. */
export const DOMAIN = "lethe";

/** One `google.rpc.BadRequest` field violation: which field, and why. */
export interface FieldViolation {
  readonly field: string;
  readonly description: string;
}

/** A failed call, with what the server said about it. */
export class LetheError extends Error {
  /** The status code this class stands for; undefined for any. */
  static readonly statusCode: Code | undefined = undefined;
  /** The reason this class stands for; "" for any reason of its code. */
  static readonly reasonName: string = "";

  /** The call's status code (connect-es's `Code`, gRPC's numbers). */
  readonly code: Code;
  /** The ErrorInfo reason (an `ErrorReason` value name, such as "RECORD_DELETED"), or "". */
  readonly reason: string;
  /** The ErrorInfo metadata: ids and addresses (OWNER_MOVED: `shard`, `target`), never content. */
  readonly infoMetadata: Readonly<Record<string, string>>;
  /** Milliseconds to wait before retrying, from a `google.rpc.RetryInfo`; undefined without one. */
  readonly retryDelay: number | undefined;
  /** The fields a `google.rpc.BadRequest` names (BAD_FIELD). */
  readonly fieldViolations: readonly FieldViolation[];
  /** The records a `google.rpc.PreconditionFailure` names (SOURCE_DELETED, ...). */
  readonly preconditionSubjects: readonly string[];
  /** The error as the transport raised it. */
  override readonly cause: ConnectError;

  constructor(cause: ConnectError) {
    super(cause.rawMessage);
    this.name = new.target.name;
    this.cause = cause;
    this.code = cause.code;
    let reason = "";
    let metadata: Record<string, string> = {};
    for (const info of cause.findDetails(ErrorInfoSchema)) {
      if (info.domain === DOMAIN) {
        reason = info.reason;
        metadata = { ...info.metadata };
        break;
      }
    }
    this.reason = reason;
    this.infoMetadata = metadata;
    const retry = cause.findDetails(RetryInfoSchema)[0]?.retryDelay;
    this.retryDelay =
      retry === undefined ? undefined : Number(retry.seconds) * 1000 + retry.nanos / 1e6;
    this.fieldViolations = cause
      .findDetails(BadRequestSchema)
      .flatMap((bad) => bad.fieldViolations)
      .map((v) => ({ field: v.field, description: v.description }));
    this.preconditionSubjects = cause
      .findDetails(PreconditionFailureSchema)
      .flatMap((failure) => failure.violations)
      .map((v) => v.subject);
  }
}

// -- one class per status code ------------------------------------------------------

export class Cancelled extends LetheError {
  static override readonly statusCode = Code.Canceled;
}
export class Unknown extends LetheError {
  static override readonly statusCode = Code.Unknown;
}
export class InvalidArgument extends LetheError {
  static override readonly statusCode = Code.InvalidArgument;
}
export class DeadlineExceeded extends LetheError {
  static override readonly statusCode = Code.DeadlineExceeded;
}
export class NotFound extends LetheError {
  static override readonly statusCode = Code.NotFound;
}
export class AlreadyExists extends LetheError {
  static override readonly statusCode = Code.AlreadyExists;
}
export class PermissionDenied extends LetheError {
  static override readonly statusCode = Code.PermissionDenied;
}
export class ResourceExhausted extends LetheError {
  static override readonly statusCode = Code.ResourceExhausted;
}
export class FailedPrecondition extends LetheError {
  static override readonly statusCode = Code.FailedPrecondition;
}
export class Aborted extends LetheError {
  static override readonly statusCode = Code.Aborted;
}
export class OutOfRange extends LetheError {
  static override readonly statusCode = Code.OutOfRange;
}
export class Unimplemented extends LetheError {
  static override readonly statusCode = Code.Unimplemented;
}
export class Internal extends LetheError {
  static override readonly statusCode = Code.Internal;
}
export class Unavailable extends LetheError {
  static override readonly statusCode = Code.Unavailable;
}
export class DataLoss extends LetheError {
  static override readonly statusCode = Code.DataLoss;
}
export class Unauthenticated extends LetheError {
  static override readonly statusCode = Code.Unauthenticated;
}

// -- one class per documented reason --------------------------------------------------

/** No bearer token was sent. */
export class MissingToken extends Unauthenticated {
  static override readonly reasonName = "MISSING_TOKEN";
}
/** The token is malformed, unknown, revoked or expired, or two were sent. */
export class InvalidToken extends Unauthenticated {
  static override readonly reasonName = "INVALID_TOKEN";
}
/** The token may not act for the owner the request names. */
export class OwnerNotAllowed extends PermissionDenied {
  static override readonly reasonName = "OWNER_NOT_ALLOWED";
}
/** A field is malformed: `fieldViolations` names it. */
export class BadField extends InvalidArgument {
  static override readonly reasonName = "BAD_FIELD";
}
/** A vector's dimension differs from the owner's index. */
export class DimensionMismatch extends InvalidArgument {
  static override readonly reasonName = "DIMENSION_MISMATCH";
}
/** The request bytes (or JSON) are not the method's request message. */
export class MalformedRequest extends InvalidArgument {
  static override readonly reasonName = "MALFORMED_REQUEST";
}
/** The `x-lethe-owner` header names another owner than the request (a misrouted call). */
export class OwnerHeaderMismatch extends InvalidArgument {
  static override readonly reasonName = "OWNER_HEADER_MISMATCH";
}
/** A sharded server (or its proxy) got a call without `x-lethe-owner`. */
export class OwnerHeaderMissing extends InvalidArgument {
  static override readonly reasonName = "OWNER_HEADER_MISSING";
}
/** The record existed and was deleted, or has expired. */
export class RecordDeleted extends NotFound {
  static override readonly reasonName = "RECORD_DELETED";
}
/** A second active memory on the same slot and scope. */
export class SlotConflict extends AlreadyExists {
  static override readonly reasonName = "SLOT_CONFLICT";
}
/** The store has reached its size bound; the write was refused whole. */
export class StoreFull extends ResourceExhausted {
  static override readonly reasonName = "STORE_FULL";
}
/** Too many calls in flight (the server's, or this token's): retry after `retryDelay`. */
export class TooManyRequests extends ResourceExhausted {
  static override readonly reasonName = "TOO_MANY_REQUESTS";
}
/** Too many open streams: close one, or retry after `retryDelay`. */
export class TooManyStreams extends ResourceExhausted {
  static override readonly reasonName = "TOO_MANY_STREAMS";
}
export class SourceDeleted extends FailedPrecondition {
  static override readonly reasonName = "SOURCE_DELETED";
}
export class SourceStale extends FailedPrecondition {
  static override readonly reasonName = "SOURCE_STALE";
}
export class SourceSealed extends FailedPrecondition {
  static override readonly reasonName = "SOURCE_SEALED";
}
export class SourcePending extends FailedPrecondition {
  static override readonly reasonName = "SOURCE_PENDING";
}
export class IllegalTransition extends FailedPrecondition {
  static override readonly reasonName = "ILLEGAL_TRANSITION";
}
export class RepairNotContinued extends FailedPrecondition {
  static override readonly reasonName = "REPAIR_NOT_CONTINUED";
}
export class Restricted extends FailedPrecondition {
  static override readonly reasonName = "RESTRICTED";
}
export class Sealed extends FailedPrecondition {
  static override readonly reasonName = "SEALED";
}
/** The owner moved to another shard: `infoMetadata.shard` and `.target` say where. */
export class OwnerMoved extends FailedPrecondition {
  static override readonly reasonName = "OWNER_MOVED";
}
/** The write repeats a text forgotten within the echo guard's window: refused. */
export class EchoesForgotten extends FailedPrecondition {
  static override readonly reasonName = "ECHOES_FORGOTTEN";
}
/** `expected_version` is not the current one. */
export class VersionMismatch extends Aborted {
  static override readonly reasonName = "VERSION_MISMATCH";
}
/** A storage fault stopped a write; nothing was applied. */
export class StorageUnavailable extends Unavailable {
  static override readonly reasonName = "STORAGE_UNAVAILABLE";
}
/** The server is stopping: retry (streams resume with `after`). */
export class Draining extends Unavailable {
  static override readonly reasonName = "DRAINING";
}
/** The owner's shard cannot be reached (from the sharding proxy). */
export class ShardUnavailable extends Unavailable {
  static override readonly reasonName = "SHARD_UNAVAILABLE";
}
/** The owner is being moved between shards: retry. */
export class OwnerMoving extends Unavailable {
  static override readonly reasonName = "OWNER_MOVING";
}
/** Stored ciphertext failed authentication while its key exists. */
export class Integrity extends DataLoss {
  static override readonly reasonName = "INTEGRITY";
}

type ErrorClass = typeof LetheError;

const BY_CODE = new Map<Code, ErrorClass>(
  [
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
  ].map((cls) => [cls.statusCode as Code, cls]),
);

const BY_REASON = new Map<string, ErrorClass>(
  [
    MissingToken,
    InvalidToken,
    OwnerNotAllowed,
    BadField,
    DimensionMismatch,
    MalformedRequest,
    OwnerHeaderMismatch,
    OwnerHeaderMissing,
    RecordDeleted,
    SlotConflict,
    StoreFull,
    TooManyRequests,
    TooManyStreams,
    SourceDeleted,
    SourceStale,
    SourceSealed,
    SourcePending,
    IllegalTransition,
    RepairNotContinued,
    Restricted,
    Sealed,
    OwnerMoved,
    EchoesForgotten,
    VersionMismatch,
    StorageUnavailable,
    Draining,
    ShardUnavailable,
    OwnerMoving,
    Integrity,
  ].map((cls) => [cls.reasonName, cls]),
);

/**
 * Any error of a call as the most precise `LetheError` class: the class of
 * its reason when the reason's code matches the call's, else the class of
 * its code. A LetheError is returned as it is.
 */
export function toLetheError(error: unknown): LetheError {
  if (error instanceof LetheError) {
    return error;
  }
  const cause = ConnectError.from(error);
  const made = new LetheError(cause);
  const byReason = BY_REASON.get(made.reason);
  const cls =
    byReason !== undefined && byReason.statusCode === cause.code
      ? byReason
      : (BY_CODE.get(cause.code) ?? LetheError);
  return cls === LetheError ? made : new cls(cause);
}
