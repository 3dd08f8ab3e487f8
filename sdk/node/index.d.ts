// Types for zygo-sdk, written by hand beside index.js (there is no build step).
// test/types.test.js reads this file against the module: every export, every Client
// method and every option a call reads must be declared here.

export declare const VERSION: string;
export declare const DEFAULT_URL: string;
/** A pooled connection idle for longer than this many seconds is dropped, not reused. */
export declare const MAX_IDLE: number;

// ---- errors ------------------------------------------------------------------------------

export interface ErrorFields {
  status?: number | null;
  code?: string | null;
  requestId?: string | null;
  retryAfter?: number | null;
  stdout?: string;
  stderr?: string;
  exitCode?: number | null;
  traceback?: string | null;
  oomKilled?: boolean;
  started?: boolean | null;
  body?: Record<string, unknown>;
}

/** Any failure the client reports; 409, 413, 422 and 500 `internal` are this class itself. */
export declare class ZygoError extends Error {
  constructor(message: string, fields?: ErrorFields);
  /** The HTTP status; null for a transport failure. */
  status: number | null;
  /** The API's machine-readable code, e.g. "busy", "handler", "above_ceiling". */
  code: string | null;
  requestId: string | null;
  /** Seconds, from Retry-After. */
  retryAfter: number | null;
  stdout: string;
  stderr: string;
  exitCode: number | null;
  traceback: string | null;
  oomKilled: boolean;
  started: boolean | null;
  body: Record<string, unknown>;
}
export declare class BadRequest extends ZygoError {}
export declare class AuthError extends ZygoError {}
export declare class NotFound extends ZygoError {}
/** 429: refused before anything ran; resent by the client unless `retryBusy: false`. */
export declare class Busy extends ZygoError {}
export declare class Unavailable extends ZygoError {}
export declare class HandlerError extends ZygoError {}
export declare class Timeout extends ZygoError {}
export declare class Cancelled extends ZygoError {}
export declare class Stuck extends ZygoError {}
export declare class TransportError extends ZygoError {}

/** The error a non-2xx answer stands for. */
export declare function errorFromAnswer(status: number, body: unknown, retryAfter?: number | null, requestId?: string | null): ZygoError;

// ---- answers -----------------------------------------------------------------------------

export interface Metrics {
  wallMs: number | null;
  cpuMs: number | null;
  peakRssKb: number | null;
}

/** A call's answer. */
export interface Result<T = unknown> {
  /** What the handler returned. */
  result: T;
  requestId: string | null;
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  /** true unless Zygo could not start the request; an older API's answer counts as true. */
  started: boolean;
  metrics: Metrics;
  /** The request's directory as a tar, when the call asked for `out`. */
  workspace: Buffer | null;
  /** A stream's result only: the stream was read too slowly, so output events were dropped
   * from some point on (`stdout` and `stderr` are still whole up to their caps). */
  streamTruncated: boolean;
  raw: Record<string, unknown>;
}

export type StreamEvent<T = unknown> =
  | { kind: 'stdout' | 'stderr' | 'progress'; data: string }
  | { kind: 'result'; result: Result<T> };

export interface RunResult {
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  oomKilled: boolean;
  peakRssKb: number | null;
  wallMs: number | null;
  cpuMs: number | null;
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  started: boolean;
  phase: string | null;
  error: string | null;
  requestId: string | null;
  /** The program ran and exited 0. */
  ok: boolean;
  raw: Record<string, unknown>;
}

export interface Script {
  sha256: string;
  size: number | null;
  existed: boolean;
  held: boolean;
  raw: Record<string, unknown>;
}

export interface Blob {
  sha256: string;
  size: number | null;
  existed: boolean;
  raw: Record<string, unknown>;
}

export interface Deps {
  id: string;
  state: 'building' | 'ready' | 'failed' | string;
  image: string | null;
  /** The resolver's own words when the build failed. */
  log: string | null;
  building: boolean;
  ready: boolean;
  failed: boolean;
  raw: Record<string, unknown>;
}

export interface FunctionInfo {
  name: string;
  kind: 'function' | 'pool' | string;
  state: string;
  error: string | null;
  zygotes: Record<string, number>;
  inFlight: number;
  minWarm: number | null;
  maxWarm: number | null;
  raw: Record<string, unknown>;
}

export interface Tenant {
  id: string;
  createdMs: number | null;
  limits: Record<string, unknown>;
  functions: string[];
  scripts: string[];
  tokens: number;
  /** From createTenant: whether it is new. */
  created: boolean | null;
  raw: Record<string, unknown>;
}

export interface Token {
  id: string;
  tenant: string | null;
  createdMs: number | null;
  revokedMs: number | null;
  /** Only in the answer that minted it. */
  secret: string | null;
  raw: Record<string, unknown>;
}

export interface Health {
  status: 'ok' | 'degraded' | string;
  reason: string | null;
  ok: boolean;
}

export interface Version {
  version: string;
  api: number | null;
  backend: string | null;
  cgroup: string | null;
  landlockAbi: number | null;
  privateNet: boolean | null;
  raw: Record<string, unknown>;
}

/** Zygo's other small answers, with their keys in camelCase. */
export type Answer = Record<string, unknown>;

/** A call's answer from its JSON. */
export declare function toResult(v: unknown): Result;
/** Keys in camelCase, recursively. */
export declare function camelize(v: unknown): unknown;

// ---- options -----------------------------------------------------------------------------

export interface ConnectOptions {
  /** Bearer token; default ZYGO_API_TOKEN. */
  token?: string;
  /** How many times to resend Busy and Unavailable; default 0. */
  retries?: number;
  /** Base wait in seconds, doubled per attempt (the longer of it and Retry-After); default 1. */
  backoff?: number;
  /**
   * Past `retries`, resend a request refused as Busy (nothing of it ran) after the
   * server's Retry-After (1 s without one; each wait at most 5 s), for up to 30 s after
   * it was first sent and never past its timeout; default true. false: throw Busy as it
   * comes.
   */
  retryBusy?: boolean;
  /** Default wait of a call, seconds. */
  timeout?: number | null;
  /** Act for this tenant (X-Zygo-Tenant); see forTenant. */
  tenant?: string | null;
  /** Idle connections kept; default 32. */
  poolSize?: number;
  /** Extra options for tls.connect (ca, cert, …) on https:// addresses. */
  tls?: import('node:tls').ConnectionOptions;
}

export interface RequestOptions {
  /** Seconds to wait (X-Zygo-Timeout-Ms). */
  timeout?: number;
  /** Names the request for cancel() (X-Zygo-Request-Key). */
  key?: string;
  /** Aborting cancels the request on the server too. */
  signal?: AbortSignal;
}

export interface CallOptions extends RequestOptions {
  /** A blob digest (or the object putBlob returned) unpacked into the request's directory. */
  workspace?: string | { sha256: string };
  /** Return the request's directory as a tar in `workspace`. */
  out?: boolean;
}

export type Workspace = { inline: string } | { blob: string } | { sha256: string } | string | Uint8Array;

export interface ScriptCallOptions extends RequestOptions {
  /** The script's source, instead of a registered digest. */
  source?: string;
  workspace?: Workspace;
  out?: boolean;
}

export interface ServeOptions {
  /** The folder on the server the layer's relative paths are relative to. */
  baseDir?: string;
}

export interface ServeRuntimeOptions extends ServeOptions {
  /** Secret names each call gets from the calling tenant's store. */
  secrets?: string[];
  /** A dependency set's id (or the object putDeps returned). */
  deps?: string | { id: string };
}

export interface RunOptions {
  image?: string;
  mem?: string | number;
  cpu?: number;
  pids?: number;
  /** The sandbox's deadline: seconds, or a string like '30s'. */
  timeout?: number | string;
  scratch?: string | number;
  network?: 'none' | 'egress';
  /** With network 'egress': the 'host:port' destinations the run may reach. */
  allow?: string[];
  env?: Record<string, string>;
  stdin?: string;
  key?: string;
  /** Seconds the API waits before answering 408; default timeout + 10. */
  wait?: number;
  signal?: AbortSignal;
}

export interface LogsOptions {
  /** 1 to 1000; default 100. */
  limit?: number;
}

export interface DrainOptions {
  /** Seconds; default 30. */
  grace?: number;
}

/** A PATCH: keys given are set, null clears one, the rest are left alone. */
export interface Limits {
  mem?: string | number | null;
  cpu?: number | null;
  pids?: number | null;
  timeout?: string | number | null;
  scratch?: string | number | null;
  network?: 'none' | 'egress' | null;
  allow?: string[] | null;
}

export type Layer = Record<string, unknown>;

// ---- the client --------------------------------------------------------------------------

/** A client for the API at `url` (else ZYGO_API_URL, else http://127.0.0.1:7700). */
export declare function connect(url?: string, options?: ConnectOptions): Client;

/** Where the API is, from the argument, ZYGO_API_URL or the default. */
export declare function parseAddress(url?: string): {
  kind: 'unix' | 'tcp';
  path?: string;
  host?: string;
  port?: number;
  tls?: boolean;
  prefix: string;
  hostHeader: string;
  text: string;
};

export declare class Client {
  constructor(url?: string, options?: ConnectOptions);
  readonly url: string;
  readonly actingFor: string | null;
  retries: number;
  backoff: number;
  retryBusy: boolean;
  timeout: number | null;
  close(): void;
  forTenant(id: string): Client;
  fn<T = unknown>(name: string): (event?: unknown, options?: CallOptions) => Promise<Result<T>>;

  health(): Promise<Health>;
  version(): Promise<Version>;
  drain(options?: DrainOptions): Promise<Answer>;

  functions(): Promise<FunctionInfo[]>;
  serve(name: string, layer: Layer, options?: ServeOptions): Promise<Answer>;
  stop(name: string): Promise<Answer>;
  call<T = unknown>(name: string, event?: unknown, options?: CallOptions): Promise<Result<T>>;
  batch<T = unknown>(name: string, events: Iterable<unknown>, options?: RequestOptions): Promise<Array<Result<T> | ZygoError>>;
  stream<T = unknown>(name: string, event?: unknown, options?: CallOptions): AsyncGenerator<StreamEvent<T>, void, undefined>;
  cancel(key: string): Promise<number>;
  logs(name: string, options?: LogsOptions): Promise<Answer[]>;
  stats(name: string): Promise<Answer>;
  warm(name: string, n?: number): Promise<Answer>;
  run(cmd: string[], options?: RunOptions): Promise<RunResult>;

  runtimes(): Promise<FunctionInfo[]>;
  serveRuntime(name: string, layer: Layer, options?: ServeRuntimeOptions): Promise<Answer>;
  stopRuntime(name: string): Promise<Answer>;
  runScript<T = unknown>(runtime: string, script: string | Script | null | undefined, event?: unknown, options?: ScriptCallOptions): Promise<Result<T>>;
  streamScript<T = unknown>(runtime: string, script: string | Script | null | undefined, event?: unknown, options?: ScriptCallOptions): AsyncGenerator<StreamEvent<T>, void, undefined>;

  putScript(source: string | Uint8Array): Promise<Script>;
  script(digest: string | Script): Promise<Script>;
  deleteScript(digest: string | Script): Promise<Answer>;
  putBlob(data: Uint8Array): Promise<Blob>;
  deleteBlob(digest: string | Blob): Promise<Answer>;
  putDeps(image: string, files: Record<string, string | Uint8Array>): Promise<Deps>;
  deps(): Promise<Deps[]>;
  deps(id: string): Promise<Deps>;
  deleteDeps(id: string): Promise<Answer>;

  createTenant(id: string): Promise<Tenant>;
  tenants(): Promise<Tenant[]>;
  tenant(id: string): Promise<Tenant>;
  deleteTenant(id: string): Promise<Answer>;
  setLimits(id: string, limits: Limits): Promise<Tenant>;
  putSecret(tenant: string, name: string, value: string): Promise<Answer>;
  deleteSecret(tenant: string, name: string): Promise<Answer>;
  secrets(tenant: string): Promise<string[]>;

  mintToken(tenant?: string): Promise<Token>;
  tokens(): Promise<Token[]>;
  revokeToken(id: string): Promise<Answer>;
}

declare const _default: { connect: typeof connect; Client: typeof Client };
export default _default;
