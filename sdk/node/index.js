// A client for the Zygo HTTP API: Node 18 or newer, ES modules, no dependencies.
//
//   import { connect } from 'zygo-sdk';
//   const client = connect();                   // ZYGO_API_URL, ZYGO_API_TOKEN
//   const out = await client.call('resize', { url: '…' }, { timeout: 5 });
//   console.log(out.result, out.metrics.wallMs);
//
// HTTP/1.1 is written out by hand over net/tls sockets (unix sockets included) so that the
// client knows whether any byte of an answer arrived: a request on a reused connection that
// got nothing back is sent once more on a fresh one; anything else is a TransportError.

import net from 'node:net';
import tls from 'node:tls';
import { randomUUID } from 'node:crypto';

export const VERSION = '0.1.5';
export const DEFAULT_URL = 'http://127.0.0.1:7700';
/** A pooled connection idle for longer than this (seconds) is dropped, not reused. */
export const MAX_IDLE = 20;
const CONNECT_TIMEOUT = 10;
const DEFAULT_WAIT = 60;
const SLACK = 10;
// A request refused as Busy (429: nothing of it ran) once `retries` are used up is sent
// again while `retryBusy` is on: after the server's Retry-After (BUSY_WAIT without one),
// each wait between BUSY_WAIT_MIN and BUSY_WAIT_MAX, for as long as the next send comes
// within BUSY_FOR of the first, and within the call's own timeout when it has one.
const BUSY_WAIT = 1;
const BUSY_WAIT_MIN = 0.1;
const BUSY_WAIT_MAX = 5;
const BUSY_FOR = 30;
const MAX_HEAD = 64 * 1024;
const MAX_BODY = 1024 * 1024 * 1024;
const MAX_LINE = 64 * 1024 * 1024;

// ---- errors ------------------------------------------------------------------------------

/** Any failure the client reports; 409, 413, 422 and 500 `internal` are this class itself. */
export class ZygoError extends Error {
  constructor(message, fields = {}) {
    super(message);
    this.name = new.target.name;
    this.status = fields.status ?? null;
    this.code = fields.code ?? null;
    this.requestId = fields.requestId ?? null;
    this.retryAfter = fields.retryAfter ?? null;
    this.stdout = fields.stdout ?? '';
    this.stderr = fields.stderr ?? '';
    this.exitCode = fields.exitCode ?? null;
    this.traceback = fields.traceback ?? null;
    this.oomKilled = fields.oomKilled ?? false;
    this.started = fields.started ?? null;
    this.body = fields.body ?? {};
  }
}
/** 400: malformed request, refused spec, or a secret the call needs is missing. */
export class BadRequest extends ZygoError {}
/** 401 or 403: no token, unknown or revoked token, or a token without the rights. */
export class AuthError extends ZygoError {}
/** 404: no such thing, or not yours. */
export class NotFound extends ZygoError {}
/**
 * 429: refused before anything ran; safe to send again after `retryAfter` seconds. The
 * client sends it again itself unless `retryBusy: false`: thrown, it was refused for 30 s,
 * or until the call's timeout.
 */
export class Busy extends ZygoError {}
/** 503: the host cannot do this yet (starting, draining, deps building). Nothing ran. */
export class Unavailable extends ZygoError {}
/** 500 `handler`: the handler raised or exited non-zero. */
export class HandlerError extends ZygoError {}
/** 504 `timeout` (deadline kill) or 408 `api_timeout` (the API's own wait on a run). */
export class Timeout extends ZygoError {}
/** 499: cancelled by its key. */
export class Cancelled extends ZygoError {}
/** 504 `stuck`: the sandbox stopped answering and was killed. */
export class Stuck extends ZygoError {}
/** The connection failed: could not connect, or broke after the first byte. Never retried. */
export class TransportError extends ZygoError {}

const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const str = (v, d = '') => (typeof v === 'string' ? v : d);
const ostr = (v) => (typeof v === 'string' ? v : null);
const num = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const int = (v) => (Number.isInteger(v) ? v : null);
const bool = (v, d = false) => (typeof v === 'boolean' ? v : d);

/** The error a non-2xx answer stands for. */
export function errorFromAnswer(status, body, retryAfter = null, requestId = null) {
  const b = isObj(body) ? body : {};
  const code = ostr(b.code);
  let message = ostr(b.error);
  if (!message) {
    if (status === 503 && b.status === 'stopping') message = 'the API is stopping (draining); nothing new is taken';
    else if (typeof body === 'string' && body.trim()) message = `HTTP ${status}: ${body.trim().slice(0, 500)}`;
    else message = `HTTP ${status}`;
  }
  let Cls = ZygoError;
  if (status === 400) Cls = BadRequest;
  else if (status === 401 || status === 403) Cls = AuthError;
  else if (status === 404) Cls = NotFound;
  else if (status === 408) Cls = Timeout;
  else if (status === 429) Cls = Busy;
  else if (status === 499) Cls = Cancelled;
  else if (status === 500 && code === 'handler') Cls = HandlerError;
  else if (status === 503) Cls = Unavailable;
  else if (status === 504) Cls = code === 'stuck' ? Stuck : Timeout;
  const ran = [HandlerError, Timeout, Cancelled, Stuck].includes(Cls);
  return new Cls(message, {
    status,
    code,
    requestId: ostr(b.request_id) ?? requestId,
    retryAfter: retryAfter ?? num(b.retry_after),
    stdout: str(b.stdout),
    stderr: str(b.stderr),
    exitCode: int(b.exit_code),
    traceback: ostr(b.traceback),
    oomKilled: b.oom_killed === true,
    started: typeof b.started === 'boolean' ? b.started : ran ? true : null,
    body: b,
  });
}

// ---- answers -----------------------------------------------------------------------------

const camel = (k) => k.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

/** Zygo's own small answers with their keys in camelCase (recursively). */
export function camelize(v) {
  if (Array.isArray(v)) return v.map(camelize);
  if (!isObj(v)) return v;
  const out = {};
  for (const [k, x] of Object.entries(v)) out[camel(k)] = camelize(x);
  return out;
}

function metrics(v) {
  const d = isObj(v) ? v : {};
  return { wallMs: num(d.wall_ms), cpuMs: num(d.cpu_ms), peakRssKb: int(d.peak_rss_kb) };
}

function workspaceOf(d) {
  let v = d.workspace;
  if (isObj(v)) v = v.inline;
  if (typeof v !== 'string') return null;
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(v) || v.length % 4 !== 0) {
    throw new ZygoError("the answer's workspace is not valid base64");
  }
  return Buffer.from(v, 'base64');
}

/** A call's answer. */
export function toResult(v) {
  const d = isObj(v) ? v : {};
  return {
    result: d.result === undefined ? null : d.result,
    requestId: ostr(d.request_id),
    stdout: str(d.stdout),
    stderr: str(d.stderr),
    stdoutTruncated: bool(d.stdout_truncated),
    stderrTruncated: bool(d.stderr_truncated),
    // An API one release behind does not send it, and only answered once the program ran.
    started: bool(d.started, true),
    metrics: metrics(d.metrics),
    workspace: workspaceOf(d),
    // A stream's result only: events were dropped because the stream was read too slowly.
    streamTruncated: bool(d.stream_truncated),
    raw: d,
  };
}

function toRunResult(v) {
  const d = isObj(v) ? v : {};
  const r = {
    exitCode: int(d.exit_code),
    signal: int(d.signal),
    timedOut: bool(d.timed_out),
    oomKilled: bool(d.oom_killed),
    peakRssKb: int(d.peak_rss_kb),
    wallMs: num(d.wall_ms),
    cpuMs: num(d.cpu_ms),
    stdout: str(d.stdout),
    stderr: str(d.stderr),
    stdoutTruncated: bool(d.stdout_truncated),
    stderrTruncated: bool(d.stderr_truncated),
    started: bool(d.started, true),
    phase: ostr(d.phase),
    error: ostr(d.error),
    requestId: ostr(d.request_id),
    raw: d,
  };
  r.ok = r.started && r.exitCode === 0 && !r.timedOut && !r.oomKilled;
  return r;
}

const toScript = (v) => {
  const d = isObj(v) ? v : {};
  return { sha256: str(d.sha256), size: int(d.size), existed: bool(d.existed), held: bool(d.held, true), raw: d };
};
const toBlob = (v) => {
  const d = isObj(v) ? v : {};
  return { sha256: str(d.sha256), size: int(d.size), existed: bool(d.existed), raw: d };
};
const toDeps = (v) => {
  const d = isObj(v) ? v : {};
  const state = str(d.state);
  return {
    id: str(d.id),
    state,
    image: ostr(d.image),
    log: ostr(d.log),
    building: state === 'building',
    ready: state === 'ready',
    failed: state === 'failed',
    raw: d,
  };
};
const toFunction = (v) => {
  const d = isObj(v) ? v : {};
  return {
    name: str(d.name),
    kind: str(d.kind, 'function'),
    state: str(d.state),
    error: ostr(d.error),
    zygotes: isObj(d.zygotes) ? { ...d.zygotes } : {},
    inFlight: int(d.in_flight) ?? 0,
    minWarm: int(d.min_warm),
    maxWarm: int(d.max_warm),
    raw: d,
  };
};
const toTenant = (v, created = null) => {
  const d = isObj(v) ? v : {};
  return {
    id: str(d.id),
    createdMs: int(d.created_ms),
    limits: isObj(d.limits) ? { ...d.limits } : {},
    functions: Array.isArray(d.functions) ? d.functions.filter((x) => typeof x === 'string') : [],
    scripts: Array.isArray(d.scripts) ? d.scripts.filter((x) => typeof x === 'string') : [],
    tokens: int(d.tokens) ?? 0,
    created,
    raw: d,
  };
};
const toToken = (v) => {
  const d = isObj(v) ? v : {};
  return {
    id: str(d.id),
    tenant: ostr(d.tenant),
    createdMs: int(d.created_ms),
    revokedMs: int(d.revoked_ms),
    secret: ostr(d.secret),
    raw: d,
  };
};
const toHealth = (v) => {
  const d = isObj(v) ? v : {};
  return { status: str(d.status), reason: ostr(d.reason), ok: d.status === 'ok' };
};
const toVersion = (v) => {
  const d = isObj(v) ? v : {};
  return {
    version: str(d.version),
    api: int(d.api),
    backend: ostr(d.backend),
    cgroup: ostr(d.cgroup),
    landlockAbi: int(d.landlock_abi),
    privateNet: typeof d.private_net === 'boolean' ? d.private_net : null,
    raw: d,
  };
};
const list = (key, item) => (v) => {
  if (!isObj(v) || !Array.isArray(v[key])) throw new ZygoError(`the answer has no "${key}" list`);
  return v[key].map((x) => item(x));
};
const batchElement = (v) => {
  const d = isObj(v) ? v : {};
  if (d.status === 200 || (d.status === undefined && d.error === undefined)) return toResult(d);
  return errorFromAnswer(Number.isInteger(d.status) ? d.status : 500, d);
};

// ---- addresses ---------------------------------------------------------------------------

function hostPort(s, defaultPort, url) {
  let host;
  let port = '';
  if (s.startsWith('[')) {
    const end = s.indexOf(']');
    if (end < 0) throw new Error(`bad address ${JSON.stringify(url)}: unclosed '[' in the host`);
    host = s.slice(1, end);
    const rest = s.slice(end + 1);
    if (rest && !rest.startsWith(':')) throw new Error(`bad address ${JSON.stringify(url)}`);
    port = rest.slice(1);
  } else if (s.split(':').length === 2) {
    [host, port] = s.split(':');
  } else if (s.includes(':')) {
    throw new Error(`bad address ${JSON.stringify(url)}: an IPv6 host goes in brackets, [::1]:7700`);
  } else {
    host = s;
  }
  if (!host) throw new Error(`bad address ${JSON.stringify(url)}: no host`);
  if (port) {
    if (!/^\d+$/.test(port) || +port < 1 || +port > 65535) {
      throw new Error(`bad address ${JSON.stringify(url)}: the port must be a number from 1 to 65535`);
    }
    return [host, +port];
  }
  return [host, defaultPort];
}

/**
 * Where the API is: the argument, else ZYGO_API_URL, else http://127.0.0.1:7700.
 * Accepted: unix:///path, http://host[:port], https://host[:port], and bare host:port.
 */
export function parseAddress(url) {
  url = (url || process.env.ZYGO_API_URL || DEFAULT_URL).trim();
  if (url.startsWith('unix://')) {
    const path = url.slice(7);
    if (!path.startsWith('/')) throw new Error(`bad address ${JSON.stringify(url)}: a unix socket is unix:///absolute/path`);
    return { kind: 'unix', path, hostHeader: 'localhost', prefix: '', text: url };
  }
  for (const [scheme, isTls, port] of [['http://', false, 80], ['https://', true, 443]]) {
    if (url.startsWith(scheme)) {
      const rest = url.slice(scheme.length);
      const slash = rest.indexOf('/');
      const hp = slash < 0 ? rest : rest.slice(0, slash);
      const prefix = slash < 0 ? '' : rest.slice(slash).replace(/\/+$/, '');
      const [host, p] = hostPort(hp, port, url);
      return addr(host, p, isTls, prefix);
    }
  }
  if (url.includes('://')) throw new Error(`bad address ${JSON.stringify(url)}: use unix://, http://, https:// or host:port`);
  const [host, p] = hostPort(url, 0, url);
  if (!p) throw new Error(`bad address ${JSON.stringify(url)}: a bare address needs a port, host:port`);
  return addr(host, p, false, '');
}

function addr(host, port, isTls, prefix) {
  const h = host.includes(':') ? `[${host}]` : host;
  const hostHeader = port === (isTls ? 443 : 80) ? h : `${h}:${port}`;
  return { kind: 'tcp', host, port, tls: isTls, prefix, hostHeader, text: `${isTls ? 'https' : 'http'}://${hostHeader}${prefix}` };
}

// ---- connections -------------------------------------------------------------------------

class BeforeFirstByte extends Error {}

function abortError(signal) {
  if (signal.reason !== undefined) return signal.reason;
  const e = new Error('This operation was aborted');
  e.name = 'AbortError';
  return e;
}

/** One connection: a socket and what has arrived on it but has not been used yet. */
class Conn {
  constructor(socket, address) {
    this.socket = socket;
    this.address = address;
    this.buf = Buffer.alloc(0);
    this.got = false;
    this.ended = false;
    this.error = null;
    this.idleSince = 0;
    this.wake = null;
    socket.on('data', (d) => {
      this.got = true;
      this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
      this.notify();
    });
    socket.on('end', () => {
      this.ended = true;
      this.notify();
    });
    socket.on('close', () => {
      this.ended = true;
      this.notify();
    });
    socket.on('error', (e) => {
      this.error = e;
      this.notify();
    });
    socket.on('timeout', () => {
      this.error = Object.assign(new Error('timed out'), { code: 'ETIMEDOUT' });
      this.notify();
      socket.destroy();
    });
  }

  notify() {
    const w = this.wake;
    if (w) {
      this.wake = null;
      w();
    }
  }

  close() {
    this.ended = true;
    this.socket.destroy();
  }

  /** Waits until something arrives; false when the connection ended with nothing new. */
  async more() {
    const before = this.buf.length;
    while (this.buf.length === before) {
      if (this.error) throw this.error;
      if (this.ended) return false;
      await new Promise((resolve) => {
        this.wake = resolve;
      });
    }
    return true;
  }

  send(data) {
    this.got = false;
    return new Promise((resolve, reject) => {
      this.socket.write(data, (e) => (e ? reject(e) : resolve()));
    });
  }

  async head() {
    for (;;) {
      const end = this.buf.indexOf('\r\n\r\n');
      if (end > MAX_HEAD) throw new TransportError("the answer's headers are larger than 64 KiB");
      if (end >= 0) {
        const raw = this.buf.subarray(0, end).toString('latin1');
        this.buf = this.buf.subarray(end + 4);
        const h = parseHead(raw);
        if (h.status >= 100 && h.status < 200) continue;
        return h;
      }
      if (this.buf.length > MAX_HEAD) throw new TransportError("the answer's headers are larger than 64 KiB");
      let more;
      try {
        more = await this.more();
      } catch (e) {
        if (!this.got && (e.code === 'ECONNRESET' || e.code === 'EPIPE')) throw new BeforeFirstByte(e.message);
        throw e;
      }
      if (!more) {
        if (!this.got) throw new BeforeFirstByte('the connection was closed');
        throw new TransportError("the connection closed in the middle of the answer's headers");
      }
    }
  }

  async exact(n) {
    while (this.buf.length < n) {
      if (!(await this.more())) throw new TransportError('the connection closed in the middle of the answer');
    }
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }

  async line(cap) {
    for (;;) {
      const i = this.buf.indexOf('\n');
      if (i >= 0) {
        const out = this.buf.subarray(0, i + 1);
        this.buf = this.buf.subarray(i + 1);
        return out;
      }
      if (this.buf.length > cap) throw new TransportError('a line of the answer is too long');
      if (!(await this.more())) throw new TransportError('the connection closed in the middle of the answer');
    }
  }

  /** The body, piece by piece, as it arrives. */
  async *pieces(h) {
    const { how, length } = framing(h);
    if (how === 'length') {
      let n = length;
      while (n > 0) {
        if (!this.buf.length && !(await this.more())) {
          throw new TransportError('the connection closed in the middle of the answer');
        }
        const take = Math.min(n, this.buf.length);
        const piece = this.buf.subarray(0, take);
        this.buf = this.buf.subarray(take);
        n -= take;
        yield piece;
      }
    } else if (how === 'chunked') {
      let total = 0;
      for (;;) {
        const line = (await this.line(4096)).toString('latin1').trim();
        const size = parseInt(line.split(';')[0].trim(), 16);
        if (!/^[0-9a-fA-F]+/.test(line) || Number.isNaN(size)) throw new TransportError(`bad chunk size ${JSON.stringify(line.slice(0, 20))}`);
        if (size === 0) {
          while ((await this.line(MAX_HEAD)).toString('latin1').trim()) {
            // trailers
          }
          return;
        }
        total += size;
        if (total > MAX_BODY) throw new TransportError('the answer is larger than 1 GiB');
        const piece = await this.exact(size);
        await this.exact(2);
        yield piece;
      }
    } else {
      let total = 0;
      for (;;) {
        if (this.buf.length) {
          const piece = this.buf;
          total += piece.length;
          if (total > MAX_BODY) throw new TransportError('the answer is larger than 1 GiB');
          this.buf = Buffer.alloc(0);
          yield piece;
        }
        if (!(await this.more())) return;
      }
    }
  }

  async body(h) {
    const { how, length } = framing(h);
    if (how === 'length') return length ? Buffer.from(await this.exact(length)) : Buffer.alloc(0);
    const parts = [];
    for await (const p of this.pieces(h)) parts.push(p);
    return Buffer.concat(parts);
  }
}

function parseHead(raw) {
  const lines = raw.split('\r\n');
  const m = /^HTTP\/1\.\d (\d{3})/.exec(lines[0]);
  if (!m) throw new TransportError(`the answer is not HTTP: ${JSON.stringify(lines[0].slice(0, 100))}`);
  const headers = {};
  for (const line of lines.slice(1)) {
    if (!line) continue;
    const i = line.indexOf(':');
    if (i < 0) throw new TransportError(`the answer is not HTTP: ${JSON.stringify(line.slice(0, 100))}`);
    const k = line.slice(0, i).trim().toLowerCase();
    const v = line.slice(i + 1).trim();
    headers[k] = k in headers ? `${headers[k]}, ${v}` : v;
  }
  return { status: +m[1], headers };
}

function framing(h) {
  if ((h.headers['transfer-encoding'] || '').toLowerCase().includes('chunked')) return { how: 'chunked', length: 0 };
  const cl = h.headers['content-length'];
  if (cl !== undefined) {
    if (!/^\d+$/.test(cl) || +cl > MAX_BODY) throw new TransportError(`bad Content-Length ${JSON.stringify(cl.slice(0, 40))}`);
    return { how: 'length', length: +cl };
  }
  if (h.status === 204 || h.status === 304) return { how: 'length', length: 0 };
  return { how: 'close', length: 0 };
}

const keepsAlive = (h) => !(h.headers.connection || '').toLowerCase().includes('close');

function retryAfterOf(h) {
  const v = h.headers['retry-after'];
  if (v === undefined) return null;
  const f = Number(v);
  return Number.isFinite(f) && f >= 0 ? f : null;
}

function parseJson(raw, h) {
  if (!raw.length) return null;
  try {
    return JSON.parse(raw.toString('utf8'));
  } catch {
    if (h.status >= 400) return raw.toString('utf8');
    throw new TransportError(`the answer (HTTP ${h.status}) is not JSON: ${JSON.stringify(raw.subarray(0, 200).toString('utf8'))}`);
  }
}

function openSocket(address, timeoutS, tlsOptions) {
  return new Promise((resolve, reject) => {
    let socket;
    const fail = (e) => {
      socket.destroy();
      reject(new TransportError(`cannot connect to the Zygo API at ${address.text}: ${e.message}`));
    };
    const ok = () => {
      socket.removeListener('error', fail);
      socket.setTimeout(0);
      resolve(socket);
    };
    if (address.kind === 'unix') {
      socket = net.connect({ path: address.path }, ok);
    } else if (address.tls) {
      socket = tls.connect({ host: address.host, port: address.port, servername: net.isIP(address.host) ? undefined : address.host, ...tlsOptions }, ok);
    } else {
      socket = net.connect({ host: address.host, port: address.port, noDelay: true }, ok);
    }
    socket.once('error', fail);
    socket.setTimeout(timeoutS * 1000, () => fail(new Error(`no connection within ${timeoutS} s`)));
  });
}

/** Idle connections shared by every view of one client; the most recent is used first. */
class Pool {
  constructor(address, size, tlsOptions) {
    this.address = address;
    this.size = size;
    this.tlsOptions = tlsOptions;
    this.idle = [];
    this.clock = () => performance.now() / 1000;
  }

  take() {
    const now = this.clock();
    while (this.idle.length) {
      const c = this.idle.pop();
      if (now - c.idleSince > MAX_IDLE || c.ended || c.error || c.buf.length) {
        c.close();
        continue;
      }
      return c;
    }
    return null;
  }

  give(c) {
    if (c.buf.length || c.ended || c.error || this.idle.length >= this.size) {
      c.close();
      return;
    }
    c.idleSince = this.clock();
    c.socket.setTimeout(0);
    c.socket.unref();
    this.idle.push(c);
  }

  async open(timeoutS) {
    return new Conn(await openSocket(this.address, timeoutS, this.tlsOptions), this.address);
  }

  close() {
    for (const c of this.idle.splice(0)) c.close();
  }
}

// ---- requests ----------------------------------------------------------------------------

const enc = (s) => {
  if (typeof s !== 'string' || !s) throw new TypeError(`expected a non-empty name, got ${JSON.stringify(s)}`);
  return encodeURIComponent(s);
};

const jsonBody = (v) => Buffer.from(JSON.stringify(v === undefined ? null : v));

function digestOf(d) {
  if (isObj(d) && typeof d.sha256 === 'string') d = d.sha256;
  if (typeof d !== 'string' || !d) throw new TypeError(`expected a digest ('sha256:…'), got ${JSON.stringify(d)}`);
  return d;
}

function duration(t) {
  if (t === undefined || t === null || typeof t === 'string') return t;
  if (typeof t !== 'number' || !(t > 0)) throw new TypeError(`a duration is a positive number of seconds or a string like '30s', got ${JSON.stringify(t)}`);
  const ms = Math.round(t * 1000);
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}

function workspaceQuery(ws) {
  if (isObj(ws) && ('inline' in ws || 'blob' in ws)) {
    throw new TypeError("a warm function's workspace goes in the query string, so it takes a blob digest only (putBlob() the tar first); runScript takes an inline tar too");
  }
  return digestOf(ws);
}

function workspaceBody(ws) {
  if (ws === undefined || ws === null) return undefined;
  if (Buffer.isBuffer(ws) || ws instanceof Uint8Array) return { inline: Buffer.from(ws).toString('base64') };
  if (isObj(ws) && !('sha256' in ws)) {
    const keys = Object.keys(ws);
    if (keys.length !== 1 || !['inline', 'blob'].includes(keys[0])) {
      throw new TypeError("workspace is { inline: <base64 tar> } or { blob: 'sha256:…' }");
    }
    return { ...ws };
  }
  return { blob: digestOf(ws) };
}

class Op {
  constructor(method, path, o = {}) {
    this.method = method;
    this.path = path;
    this.query = o.query || null;
    this.body = o.body ?? null;
    this.ctype = o.ctype || (o.body ? 'application/json' : null);
    this.timeout = o.timeout ?? null;
    this.key = o.key ?? null;
    this.decode = o.decode || camelize;
    this.cancellable = !!o.cancellable;
    this.wait = o.wait ?? null;
    this.signal = o.signal || null;
    this.sent = false;
  }
}

const sleep = (s, signal) =>
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, s * 1000);
    const onAbort = () => {
      clearTimeout(t);
      reject(abortError(signal));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });

function streamItem(line) {
  let v;
  try {
    v = JSON.parse(line.toString('utf8'));
  } catch {
    throw new TransportError(`a line of the stream is not JSON: ${JSON.stringify(line.subarray(0, 200).toString('utf8'))}`);
  }
  if (!isObj(v)) throw new TransportError('a line of the stream is not an object');
  if (typeof v.stream === 'string' && !('status' in v)) return { event: { kind: v.stream, data: v.data } };
  return { final: v };
}

function finalItem(v) {
  const status = v.status ?? 200;
  if (status === 200) return { kind: 'result', result: toResult(v) };
  throw errorFromAnswer(Number.isInteger(status) ? status : 500, v);
}

async function* ndjsonLines(pieces) {
  let rest = Buffer.alloc(0);
  for await (const p of pieces) {
    let buf = rest.length ? Buffer.concat([rest, p]) : p;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.subarray(0, i);
      buf = buf.subarray(i + 1);
      if (line.toString('latin1').trim()) yield line;
    }
    rest = buf;
    if (rest.length > MAX_LINE) throw new TransportError('a line of the stream is longer than 64 MiB');
  }
  if (rest.toString('latin1').trim()) yield rest;
}

// ---- the client --------------------------------------------------------------------------

/**
 * A client for the API at `url` (else ZYGO_API_URL, else http://127.0.0.1:7700) with
 * `options.token` (else ZYGO_API_TOKEN). Nothing is connected until the first request.
 */
export function connect(url, options = {}) {
  return new Client(url, options);
}

const CLIENT_OPTIONS = ['token', 'retries', 'backoff', 'retryBusy', 'timeout', 'tenant', 'poolSize', 'tls'];

export class Client {
  constructor(url, options = {}, shared = undefined) {
    for (const k of Object.keys(options)) {
      if (!CLIENT_OPTIONS.includes(k)) throw new TypeError(`unknown option ${JSON.stringify(k)}; the options are ${CLIENT_OPTIONS.join(', ')}`);
    }
    const { token, retries = 0, backoff = 1, retryBusy = true, timeout = null, tenant = null, poolSize = 32, tls: tlsOptions } = options;
    if (!(retries >= 0) || !(backoff >= 0)) throw new TypeError('retries and backoff must not be negative');
    if (typeof retryBusy !== 'boolean') throw new TypeError('retryBusy is true or false');
    if (!shared) {
      const address = parseAddress(url);
      const tok = token ?? (process.env.ZYGO_API_TOKEN || null);
      const base = [`Host: ${address.hostHeader}`, `User-Agent: zygo-sdk-node/${VERSION}`];
      if (tok) base.push(`Authorization: Bearer ${tok}`);
      shared = { address, pool: new Pool(address, poolSize, tlsOptions || {}), base };
    }
    this._shared = shared;
    this.retries = retries;
    this.backoff = backoff;
    this.retryBusy = retryBusy;
    this.timeout = timeout;
    this._tenant = tenant;
    this._sleep = sleep;
    this._clock = () => performance.now() / 1000;
  }

  /** The API's address. */
  get url() {
    return this._shared.address.text;
  }

  /** The tenant this view acts for (X-Zygo-Tenant), or null. */
  get actingFor() {
    return this._tenant;
  }

  /** Closes the idle pooled connections (every view shares them). */
  close() {
    this._shared.pool.close();
  }

  /** A view acting for tenant `id` (X-Zygo-Tenant), sharing this client's pool. */
  forTenant(id) {
    if (typeof id !== 'string' || !id) throw new TypeError('forTenant needs a tenant id');
    const c = new Client(undefined, { retries: this.retries, backoff: this.backoff, retryBusy: this.retryBusy, timeout: this.timeout, tenant: id }, this._shared);
    c._sleep = this._sleep;
    c._clock = this._clock;
    return c;
  }

  /** A function for one warm function: `client.fn('resize')(event, opts)`. */
  fn(name) {
    return (event, options) => this.call(name, event, options);
  }

  // -- sending --

  /** The timeout `op` is sent with (X-Zygo-Timeout-Ms), or null. */
  _timeoutOf(op) {
    return op.timeout ?? (op.cancellable ? this.timeout : null);
  }

  _requestBytes(op) {
    const headers = [...this._shared.base];
    if (this._tenant) headers.push(`X-Zygo-Tenant: ${this._tenant}`);
    let wait = op.wait ?? DEFAULT_WAIT;
    const timeout = this._timeoutOf(op);
    if (timeout !== null && timeout !== undefined) {
      if (!(timeout > 0)) throw new TypeError('timeout must be a positive number of seconds');
      headers.push(`X-Zygo-Timeout-Ms: ${Math.max(1, Math.round(timeout * 1000))}`);
      wait = timeout;
    }
    if (op.key !== null) {
      if (/[\r\n]/.test(op.key)) throw new TypeError('key must not contain a line break');
      headers.push(`X-Zygo-Request-Key: ${op.key}`);
    }
    if (op.body !== null) headers.push(`Content-Type: ${op.ctype}`);
    const hasBody = op.body !== null || ['POST', 'PUT', 'PATCH', 'DELETE'].includes(op.method);
    if (hasBody) headers.push(`Content-Length: ${op.body ? op.body.length : 0}`);
    let target = this._shared.address.prefix + op.path;
    if (op.query) target += '?' + op.query.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v).replace(/%3A/gi, ':')}`).join('&');
    const head = Buffer.from(`${op.method} ${target} HTTP/1.1\r\n${headers.join('\r\n')}\r\n\r\n`, 'latin1');
    return { data: op.body ? Buffer.concat([head, op.body]) : head, readTimeout: wait + SLACK };
  }

  async _exchange(op) {
    if (op.signal?.aborted) throw abortError(op.signal);
    if (op.cancellable && op.signal && op.key === null) op.key = `node-${randomUUID()}`;
    const { data, readTimeout } = this._requestBytes(op);
    const pool = this._shared.pool;
    let conn = pool.take();
    let reused = conn !== null;
    for (;;) {
      if (!conn) conn = await pool.open(Math.min(CONNECT_TIMEOUT, readTimeout));
      conn.socket.ref();
      conn.socket.setTimeout(readTimeout * 1000);
      const onAbort = () => conn.close();
      op.signal?.addEventListener('abort', onAbort, { once: true });
      try {
        const sending = conn.send(data);
        op.sent = true;
        await sending;
        const h = await conn.head();
        return { conn, head: h };
      } catch (e) {
        conn.close();
        if (op.signal?.aborted) throw abortError(op.signal);
        if (e instanceof ZygoError) throw e;
        if (e?.code === 'ETIMEDOUT') {
          throw new TransportError(`no answer from ${pool.address.text} within ${readTimeout} s; the request may have run`);
        }
        if (reused && !conn.got) {
          conn = null;
          reused = false;
          continue;
        }
        const where = conn.got ? 'in the middle of' : 'before';
        throw new TransportError(`the connection to ${pool.address.text} failed ${where} the answer: ${e.message}`);
      } finally {
        op.signal?.removeEventListener('abort', onAbort);
      }
    }
  }

  async _once(op) {
    const { conn, head } = await this._exchange(op);
    let raw;
    const onAbort = () => conn.close();
    op.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      raw = await conn.body(head);
    } catch (e) {
      conn.close();
      if (op.signal?.aborted) throw abortError(op.signal);
      if (e instanceof ZygoError) throw e;
      throw new TransportError(`the connection to ${this._shared.address.text} failed in the middle of the answer: ${e.message}`);
    } finally {
      op.signal?.removeEventListener('abort', onAbort);
    }
    if (keepsAlive(head)) this._shared.pool.give(conn);
    else conn.close();
    const body = parseJson(raw, head);
    if (head.status >= 200 && head.status < 300) return op.decode(body);
    throw errorFromAnswer(head.status, body, retryAfterOf(head), head.headers['x-zygo-request-id'] ?? null);
  }

  _waitBefore(attempt, e) {
    return Math.max(e.retryAfter ?? 0, this.backoff * 2 ** attempt);
  }

  /**
   * How long to wait before sending `op` again after refusal `e` (its `attempt`-th,
   * counting from 0; `began`: when it was first sent, on `this._clock`), or null to throw
   * `e`. Only Busy and Unavailable are ever sent again: both mean the request never ran.
   */
  _again(e, attempt, op, began) {
    if (!(e instanceof Busy || e instanceof Unavailable)) return null;
    if (attempt < this.retries) return this._waitBefore(attempt, e);
    if (!(e instanceof Busy) || !this.retryBusy) return null;
    const wait = Math.min(Math.max(e.retryAfter ?? BUSY_WAIT, BUSY_WAIT_MIN), BUSY_WAIT_MAX);
    const timeout = this._timeoutOf(op);
    const limit = timeout === null || timeout === undefined ? BUSY_FOR : Math.min(BUSY_FOR, timeout);
    if (this._clock() - began + wait > limit) return null;
    return wait;
  }

  async _send(op) {
    const began = this._clock();
    for (let attempt = 0; ; attempt++) {
      try {
        return await this._once(op);
      } catch (e) {
        if (op.signal?.aborted) {
          await this._cancelOnServer(op);
          throw abortError(op.signal);
        }
        const wait = this._again(e, attempt, op, began);
        if (wait === null) throw e;
        try {
          await this._sleep(wait, op.signal);
        } catch (abort) {
          throw abortError(op.signal) ?? abort;
        }
      }
    }
  }

  /** Cancels an aborted request by its key; a cancel can overtake the request it names. */
  async _cancelOnServer(op) {
    if (!op.cancellable || op.key === null || !op.sent) return;
    for (const pause of [0.02, 0.05, 0.1, 0.2]) {
      try {
        await this._once(new Op('DELETE', `/requests/${enc(op.key)}`, { wait: 5 }));
        return;
      } catch (e) {
        if (!(e instanceof NotFound)) return;
        await sleep(pause);
      }
    }
  }

  async *_stream(op) {
    const began = this._clock();
    for (let attempt = 0; ; attempt++) {
      let yielded = false;
      let conn = null;
      const onAbort = () => conn?.close();
      op.signal?.addEventListener('abort', onAbort, { once: true });
      try {
        const ex = await this._exchange(op);
        conn = ex.conn;
        const h = ex.head;
        if (h.status < 200 || h.status >= 300) {
          const body = parseJson(await conn.body(h), h);
          throw errorFromAnswer(h.status, body, retryAfterOf(h), h.headers['x-zygo-request-id'] ?? null);
        }
        for await (const line of ndjsonLines(conn.pieces(h))) {
          const { event, final } = streamItem(line);
          if (event) {
            yielded = true;
            yield event;
            continue;
          }
          yield finalItem(final);
          return;
        }
        throw new TransportError('the stream ended before its result');
      } catch (e) {
        if (op.signal?.aborted) {
          await this._cancelOnServer(op);
          throw abortError(op.signal);
        }
        // Sent again only when nothing of it was yielded (nothing ran).
        const wait = yielded ? null : this._again(e, attempt, op, began);
        if (wait !== null) {
          await this._sleep(wait, op.signal);
          continue;
        }
        if (e instanceof ZygoError) throw e;
        throw new TransportError(`the stream from ${this._shared.address.text} broke: ${e.message}`);
      } finally {
        op.signal?.removeEventListener('abort', onAbort);
        // A stream's connection is never pooled; leaving the loop early closes it, which
        // does not cancel the request.
        conn?.close();
      }
    }
  }

  // -- host --

  /** GET /healthz (no token): ok or degraded; throws Unavailable once the API is stopping. */
  health() {
    return this._send(new Op('GET', '/healthz', { decode: toHealth }));
  }

  /** GET /version. */
  version() {
    return this._send(new Op('GET', '/version', { decode: toVersion }));
  }

  /** POST /drain (deploy rights): `{ drained, inFlight }` after at most `grace` seconds. */
  drain(options = {}) {
    const { grace = 30 } = options;
    return this._send(new Op('POST', '/drain', { body: jsonBody({ grace }), wait: grace + 30 }));
  }

  // -- functions --

  /** GET /fn: the functions and pools the caller can see. */
  functions() {
    return this._send(new Op('GET', '/fn', { decode: list('functions', toFunction) }));
  }

  /** PUT /fn/{name} (deploy rights): serve a function from a layer ([fn.NAME] fields). */
  serve(name, layer, options = {}) {
    const { baseDir } = options;
    const body = { layer: { ...layer } };
    if (baseDir !== undefined) body.base_dir = baseDir;
    return this._send(new Op('PUT', `/fn/${enc(name)}`, { body: jsonBody(body), wait: 600 }));
  }

  /** DELETE /fn/{name} (deploy rights). */
  stop(name) {
    return this._send(new Op('DELETE', `/fn/${enc(name)}`, { wait: 120 }));
  }

  /**
   * POST /fn/{name}: call a warm function. `timeout` (seconds) is the wait; `key` names it
   * for cancel(); `signal` aborts it and cancels it on the server; `workspace` is a blob
   * digest; `out` returns the request's directory as a tar Buffer in `workspace`.
   */
  call(name, event = null, options = {}) {
    const { timeout, key, signal, workspace, out } = options;
    const query = [];
    if (workspace !== undefined && workspace !== null) query.push(['workspace', workspaceQuery(workspace)]);
    if (out) query.push(['out', '1']);
    return this._send(
      new Op('POST', `/fn/${enc(name)}`, { query: query.length ? query : null, body: jsonBody(event), timeout, key, signal, decode: toResult, cancellable: true }),
    );
  }

  /** POST /fn/{name}/batch: one Result or error object per event, in order (not thrown). */
  batch(name, events, options = {}) {
    const { timeout, key, signal } = options;
    return this._send(
      new Op('POST', `/fn/${enc(name)}/batch`, { body: jsonBody({ events: [...events] }), timeout, key, signal, decode: list('results', batchElement), cancellable: true }),
    );
  }

  /**
   * POST /fn/{name}?stream=1: an async iterable of `{ kind: 'stdout'|'stderr'|'progress',
   * data }` items, then `{ kind: 'result', result }`. A failed handler throws after its
   * output. Leaving the loop early closes the connection without cancelling.
   */
  stream(name, event = null, options = {}) {
    const { timeout, key, signal, workspace, out } = options;
    const query = [['stream', '1']];
    if (workspace !== undefined && workspace !== null) query.push(['workspace', workspaceQuery(workspace)]);
    if (out) query.push(['out', '1']);
    return this._stream(new Op('POST', `/fn/${enc(name)}`, { query, body: jsonBody(event), timeout, key, signal, cancellable: true }));
  }

  /** DELETE /requests/{key}: cancel the caller's requests under `key`; answers how many. */
  cancel(key) {
    return this._send(new Op('DELETE', `/requests/${enc(key)}`, { decode: (v) => (isObj(v) && Number.isInteger(v.cancelled) ? v.cancelled : 0) }));
  }

  /** GET /fn/{name}/logs: the last `limit` requests. */
  logs(name, options = {}) {
    const { limit = 100 } = options;
    return this._send(new Op('GET', `/fn/${enc(name)}/logs`, { query: [['limit', String(limit)]], decode: list('logs', camelize) }));
  }

  /** GET /fn/{name}/stats. */
  stats(name) {
    return this._send(new Op('GET', `/fn/${enc(name)}/stats`));
  }

  /** POST /fn/{name}/warm: start zygotes until `n` are ready. */
  warm(name, n = 1) {
    return this._send(new Op('POST', `/fn/${enc(name)}/warm`, { body: jsonBody({ n }), wait: 300 }));
  }

  /**
   * POST /run (deploy rights): run `cmd` once. `timeout` is the sandbox's deadline (seconds
   * or '30s'); `wait` is how long the API waits before a 408 (default: timeout + 10 s). With
   * `network: 'egress'`, `allow` lists the 'host:port' destinations it may reach.
   */
  run(cmd, options = {}) {
    if (!Array.isArray(cmd) || !cmd.length) throw new TypeError("cmd is a non-empty array of strings, e.g. ['python3', '-c', '…']");
    const { image, mem, cpu, pids, timeout, scratch, network, allow, env, stdin, key, wait, signal } = options;
    const body = { cmd: [...cmd] };
    const fields = { image, mem, cpu, pids, timeout: duration(timeout), scratch, network, allow: allow && [...allow], env, stdin };
    for (const [k, v] of Object.entries(fields)) if (v !== undefined && v !== null) body[k] = v;
    const w = wait ?? (typeof timeout === 'number' ? timeout + 10 : null);
    return this._send(new Op('POST', '/run', { body: jsonBody(body), timeout: w, key, signal, decode: toRunResult, cancellable: true }));
  }

  // -- runtime pools --

  /** GET /runtimes: the pools the caller can see. */
  runtimes() {
    return this._send(new Op('GET', '/runtimes', { decode: list('runtimes', toFunction) }));
  }

  /**
   * POST /runtimes (deploy rights): declare a pool from a layer. `secrets` names secrets each
   * call gets from the calling tenant's store; `deps` is a dependency set's id.
   */
  serveRuntime(name, layer, options = {}) {
    const { baseDir, secrets, deps } = options;
    const lay = { ...layer };
    if (secrets !== undefined) {
      if (!Array.isArray(secrets)) throw new TypeError('secrets is an array of names');
      lay.secrets = [...secrets];
    }
    if (deps !== undefined) lay.deps = isObj(deps) ? deps.id : deps;
    const body = { name, layer: lay };
    if (baseDir !== undefined) body.base_dir = baseDir;
    return this._send(new Op('POST', '/runtimes', { body: jsonBody(body), wait: 600 }));
  }

  /** DELETE /runtimes/{name} (deploy rights). */
  stopRuntime(name) {
    return this._send(new Op('DELETE', `/runtimes/${enc(name)}`, { wait: 120 }));
  }

  _scriptBody(script, event, options) {
    const { source, workspace, out } = options;
    if ((script === undefined || script === null) === (source === undefined || source === null)) {
      throw new TypeError('name the script by its digest, or pass { source }, exactly one of the two');
    }
    const body = source !== undefined && source !== null ? { source: String(source) } : { script: digestOf(script) };
    body.event = event === undefined ? null : event;
    const ws = workspaceBody(workspace);
    if (ws !== undefined) body.workspace = ws;
    if (out) body.out = true;
    return jsonBody(body);
  }

  /**
   * POST /runtimes/{runtime}/call: run a registered script (digest or the object putScript
   * returned), or `{ source }`, with `event`. `workspace` is `{ inline }`, `{ blob }`, a
   * blob, or the tar's bytes; `out` returns the directory as `workspace`.
   */
  runScript(runtime, script, event = null, options = {}) {
    const { timeout, key, signal } = options;
    const body = this._scriptBody(script, event, options);
    return this._send(new Op('POST', `/runtimes/${enc(runtime)}/call`, { body, timeout, key, signal, decode: toResult, cancellable: true }));
  }

  /** runScript as a stream, like stream(). */
  streamScript(runtime, script, event = null, options = {}) {
    const { timeout, key, signal } = options;
    const body = this._scriptBody(script, event, options);
    return this._stream(new Op('POST', `/runtimes/${enc(runtime)}/call`, { query: [['stream', '1']], body, timeout, key, signal, cancellable: true }));
  }

  // -- scripts, blobs, dependency sets --

  /** PUT /scripts: register a script (raw bytes) against the caller's tenant; idempotent. */
  putScript(source) {
    const body = Buffer.isBuffer(source) || source instanceof Uint8Array ? Buffer.from(source) : Buffer.from(String(source));
    return this._send(new Op('PUT', '/scripts', { body, ctype: 'application/octet-stream', decode: toScript }));
  }

  /** GET /scripts/{digest}: whether the host holds it for you, and its size. */
  script(digest) {
    return this._send(new Op('GET', `/scripts/${enc(digestOf(digest))}`, { decode: toScript }));
  }

  /** DELETE /scripts/{digest} (deploy rights). */
  deleteScript(digest) {
    return this._send(new Op('DELETE', `/scripts/${enc(digestOf(digest))}`));
  }

  /** PUT /blobs: store a workspace tar once; idempotent. */
  putBlob(data) {
    return this._send(new Op('PUT', '/blobs', { body: Buffer.from(data), ctype: 'application/octet-stream', decode: toBlob }));
  }

  /** DELETE /blobs/{digest} (deploy rights). */
  deleteBlob(digest) {
    return this._send(new Op('DELETE', `/blobs/${enc(digestOf(digest))}`));
  }

  /** POST /deps: build a dependency set for `image` from lock files; answers at once (building). */
  putDeps(image, files) {
    const fs = {};
    for (const [k, v] of Object.entries(files)) fs[k] = Buffer.isBuffer(v) ? v.toString('utf8') : String(v);
    return this._send(new Op('POST', '/deps', { body: jsonBody({ image, files: fs }), decode: toDeps }));
  }

  /** GET /deps/{id}: one dependency set; without an id, GET /deps: every one you can see. */
  deps(id) {
    if (id === undefined || id === null) return this._send(new Op('GET', '/deps', { decode: list('deps', toDeps) }));
    return this._send(new Op('GET', `/deps/${enc(id)}`, { decode: toDeps }));
  }

  /** DELETE /deps/{id} (deploy rights); refused while a pool is built on it. */
  deleteDeps(id) {
    return this._send(new Op('DELETE', `/deps/${enc(id)}`));
  }

  // -- tenants, limits, secrets --

  /** POST /tenants (operator): idempotent; `created` says whether it is new. */
  createTenant(id) {
    return this._send(
      new Op('POST', '/tenants', {
        body: jsonBody({ id }),
        decode: (v) => toTenant(isObj(v) ? v.tenant : null, isObj(v) && typeof v.created === 'boolean' ? v.created : null),
      }),
    );
  }

  /** GET /tenants (operator). */
  tenants() {
    return this._send(new Op('GET', '/tenants', { decode: list('tenants', (x) => toTenant(x)) }));
  }

  /** GET /tenants/{id}: the operator, or that tenant itself. */
  tenant(id) {
    return this._send(new Op('GET', `/tenants/${enc(id)}`, { decode: (v) => toTenant(v) }));
  }

  /** DELETE /tenants/{id} (deploy rights): answers what was stopped, removed and revoked. */
  deleteTenant(id) {
    return this._send(new Op('DELETE', `/tenants/${enc(id)}`, { wait: 300 }));
  }

  /**
   * PATCH /tenants/{id}/limits (deploy rights): the keys given are set (null clears one), the
   * rest left alone. Keys: mem, cpu, pids, timeout, scratch, network, allow.
   */
  setLimits(id, limits) {
    const allowed = ['mem', 'cpu', 'pids', 'timeout', 'scratch', 'network', 'allow'];
    const body = {};
    for (const [k, v] of Object.entries(limits || {})) {
      if (!allowed.includes(k)) throw new TypeError(`unknown limit ${JSON.stringify(k)}; the keys are ${allowed.join(', ')}`);
      if (v !== undefined) body[k] = k === 'timeout' ? duration(v) : v;
    }
    return this._send(new Op('PATCH', `/tenants/${enc(id)}/limits`, { body: jsonBody(body), decode: (v) => toTenant(v) }));
  }

  /** PUT /tenants/{tenant}/secrets/{name} (deploy rights): store a value, sealed. */
  putSecret(tenant, name, value) {
    return this._send(new Op('PUT', `/tenants/${enc(tenant)}/secrets/${enc(name)}`, { body: jsonBody({ value: String(value) }) }));
  }

  /** DELETE /tenants/{tenant}/secrets/{name} (deploy rights). */
  deleteSecret(tenant, name) {
    return this._send(new Op('DELETE', `/tenants/${enc(tenant)}/secrets/${enc(name)}`));
  }

  /** GET /tenants/{tenant}/secrets (operator): the names, never the values. */
  secrets(tenant) {
    return this._send(
      new Op('GET', `/tenants/${enc(tenant)}/secrets`, {
        decode: (v) => {
          const names = isObj(v) ? v.secrets : v;
          if (!Array.isArray(names)) throw new ZygoError('the answer has no "secrets" list');
          return names.map((n) => (isObj(n) ? String(n.name) : String(n)));
        },
      }),
    );
  }

  // -- tokens --

  /** POST /tenants/{tenant}/tokens, or POST /tokens for an operator token. `secret` exists only here. */
  mintToken(tenant) {
    const path = tenant === undefined || tenant === null ? '/tokens' : `/tenants/${enc(tenant)}/tokens`;
    return this._send(new Op('POST', path, { decode: toToken }));
  }

  /** GET /tokens (deploy rights): every token's record, never a secret. */
  tokens() {
    return this._send(new Op('GET', '/tokens', { decode: list('tokens', toToken) }));
  }

  /** DELETE /tokens/{id} (deploy rights): refused from the next request on. */
  revokeToken(id) {
    return this._send(new Op('DELETE', `/tokens/${enc(id)}`));
  }
}

export default { connect, Client };
