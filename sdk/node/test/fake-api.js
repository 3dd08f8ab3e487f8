// A stand-in for `zygo api` that the client tests drive: a real HTTP/1.1 server on a
// loopback port or a unix socket, on raw sockets so that a test can make it hang up, reset
// or stop in the middle of an answer exactly where the test needs it.

import net from 'node:net';
import tls from 'node:tls';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const RESULT = {
  result: { ok: true },
  request_id: 'req-1',
  stdout: '',
  stderr: '',
  stdout_truncated: false,
  stderr_truncated: false,
  started: true,
  metrics: { wall_ms: 1.5, cpu_ms: 1.0, peak_rss_kb: 1000 },
};
const FN = { name: 'f', kind: 'function', state: 'ready', error: null, zygotes: { ready: 1, busy: 0, frozen: 0, starting: 0 }, in_flight: 0, min_warm: 1, max_warm: 4 };
const TENANT = { id: 'acme', created_ms: 1, limits: {}, functions: [], scripts: [], tokens: 0 };
export const DIGEST = 'sha256:' + 'ab'.repeat(32);

export const reply = (body = {}, o = {}) => ({ type: 'reply', status: 200, body, ...o });
export const hangup = (reset = false) => ({ type: 'hangup', reset });
export const partial = (data = 'HTTP/1.1 200 OK\r\nContent-') => ({ type: 'partial', data });
export const stream = (items, o = {}) => ({ type: 'stream', items, ...o });

export function defaultAnswer(req) {
  const { method: m, path: p } = req;
  let json = null;
  try {
    json = req.json();
  } catch {
    // a raw body
  }
  if (p === '/healthz') return reply({ status: 'ok' });
  if (p === '/version') return reply({ version: '0.1.5', api: 1, backend: 'ns', cgroup: 'v1', landlock_abi: 3 });
  if (p === '/fn' && m === 'GET') return reply({ functions: [FN] });
  if (/^\/fn\/[^/]+$/.test(p)) {
    if (m === 'POST') return req.query.stream === '1' ? stream([{ stream: 'stdout', data: 'hi\n' }, { ...RESULT, status: 200 }]) : reply(RESULT);
    if (m === 'PUT') return reply({ name: p.slice(4), kind: 'function', state: 'serving' });
    return reply({ stopped: p.slice(4) });
  }
  if (p.endsWith('/batch')) return reply({ results: (json?.events || []).map(() => ({ ...RESULT, status: 200 })) });
  if (p.endsWith('/logs')) return reply({ logs: [{ request_id: 'req-1', outcome: 'ok' }] });
  if (p.endsWith('/stats')) return reply({ name: 'f', requests: 1, p50_wall_us: 10 });
  if (p.endsWith('/warm')) return reply({ name: 'f', ready: 1 });
  if (p === '/run') return reply({ exit_code: 0, signal: null, timed_out: false, oom_killed: false, peak_rss_kb: 10, wall_ms: 3, cpu_ms: 1, stdout: 'hi\n', stderr: '', started: true, phase: 'run', error: null, request_id: 'req-2' });
  if (p === '/runtimes' && m === 'GET') return reply({ runtimes: [{ ...FN, kind: 'pool' }] });
  if (p === '/runtimes' && m === 'POST') return reply({ name: json?.name, kind: 'pool', state: 'serving' });
  if (p.endsWith('/call')) return req.query.stream === '1' ? stream([{ stream: 'progress', data: '1 of 2' }, { ...RESULT, status: 200 }]) : reply(RESULT);
  if (/^\/runtimes\/[^/]+$/.test(p)) return reply({ stopped: p.split('/')[2] });
  if (p === '/scripts' || p === '/blobs') return reply({ sha256: DIGEST, size: req.body.length, existed: false });
  if (p.startsWith('/scripts/')) return reply(m === 'GET' ? { sha256: DIGEST, size: 3, held: true } : { deleted: DIGEST });
  if (p.startsWith('/blobs/')) return reply({ deleted: DIGEST });
  if (p === '/deps' && m === 'POST') return reply({ id: 'deps_1', state: 'building', image: json?.image }, { status: 202 });
  if (p === '/deps') return reply({ deps: [{ id: 'deps_1', state: 'ready' }] });
  if (p.startsWith('/deps/')) return reply(m === 'GET' ? { id: p.slice(6), state: 'ready' } : { deleted: p.slice(6) });
  if (p.startsWith('/requests/')) return reply({ cancelled: 1 });
  if (p === '/tenants' && m === 'POST') return reply({ tenant: { ...TENANT, id: json?.id }, created: true });
  if (p === '/tenants') return reply({ tenants: [TENANT] });
  if (/^\/tenants\/[^/]+$/.test(p)) return reply(m === 'GET' ? TENANT : { id: 'acme', stopped: [], scripts_removed: [], tokens_revoked: 0 });
  if (p.endsWith('/limits')) return reply({ ...TENANT, limits: json });
  if (p.endsWith('/secrets')) return reply({ secrets: ['STRIPE_KEY'] });
  if (p.includes('/secrets/')) return reply({ tenant: 'acme', name: p.split('/').pop() });
  if (m === 'POST' && p.endsWith('/tokens')) {
    return reply({ id: 'tok_1', secret: 'zygo_' + '0'.repeat(64), tenant: p.startsWith('/tenants/') ? p.split('/')[2] : null, created_ms: 1 });
  }
  if (p === '/tokens') return reply({ tokens: [{ id: 'tok_1', tenant: null, created_ms: 1, revoked_ms: null }] });
  if (p.startsWith('/tokens/')) return reply({ id: p.slice(8), revoked: true });
  if (p === '/drain') return reply({ drained: true, in_flight: 0 });
  return reply({ error: `no route ${m} ${p}`, code: 'not_found' }, { status: 404 });
}

export class FakeAPI {
  static async start({ unix = false, tls: tlsOptions = null } = {}) {
    const api = new FakeAPI();
    await api._listen(unix, tlsOptions);
    return api;
  }

  constructor() {
    this.requests = [];
    this.handler = defaultAnswer;
    this.connections = 0;
    this.closedByClient = 0;
    this.sockets = new Set();
  }

  routes() {
    return this.requests.map((r) => [r.method, r.path]);
  }

  async waitFor(pred, timeoutMs = 5000) {
    const end = Date.now() + timeoutMs;
    while (Date.now() < end) {
      if (pred()) return true;
      await new Promise((r) => setTimeout(r, 10));
    }
    return pred();
  }

  _listen(unix, tlsOptions) {
    this.server = tlsOptions ? tls.createServer(tlsOptions, (s) => this._serve(s)) : net.createServer((s) => this._serve(s));
    return new Promise((resolve) => {
      if (unix) {
        this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygo-sdk-node-'));
        this.path = path.join(this.dir, 'api.sock');
        this.server.listen(this.path, () => {
          this.url = 'unix://' + this.path;
          resolve();
        });
      } else {
        this.server.listen(0, '127.0.0.1', () => {
          this.url = tlsOptions ? `https://localhost:${this.server.address().port}` : `http://127.0.0.1:${this.server.address().port}`;
          resolve();
        });
      }
    });
  }

  async close() {
    for (const s of this.sockets) s.destroy();
    await new Promise((r) => this.server.close(r));
    if (this.dir) fs.rmSync(this.dir, { recursive: true, force: true });
  }

  _serve(sock) {
    this.connections += 1;
    const n = this.connections;
    this.sockets.add(sock);
    let buf = Buffer.alloc(0);
    let busy = false;
    let done = false;
    sock.on('error', () => {});
    sock.on('close', () => this.sockets.delete(sock));
    sock.on('end', () => {
      if (!done) this.closedByClient += 1;
      done = true;
    });
    const pump = async () => {
      if (busy || done) return;
      busy = true;
      try {
        for (;;) {
          const end = buf.indexOf('\r\n\r\n');
          if (end < 0) break;
          const head = buf.subarray(0, end).toString('latin1').split('\r\n');
          const headers = {};
          for (const line of head.slice(1)) {
            const i = line.indexOf(':');
            headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
          }
          const len = +(headers['content-length'] || 0);
          if (buf.length < end + 4 + len) break;
          const body = buf.subarray(end + 4, end + 4 + len);
          buf = buf.subarray(end + 4 + len);
          const [method, target] = head[0].split(' ');
          const u = new URL(target, 'http://x');
          const req = {
            method,
            path: decodeURIComponent(u.pathname),
            rawPath: target,
            query: Object.fromEntries(u.searchParams),
            headers,
            body,
            conn: n,
            json: () => (body.length ? JSON.parse(body.toString()) : null),
          };
          this.requests.push(req);
          const a = await this.handler(req);
          if (a.type === 'hangup') {
            done = true;
            if (a.reset) sock.resetAndDestroy();
            else sock.destroy();
            return;
          }
          if (a.type === 'partial') {
            done = true;
            sock.end(a.data);
            return;
          }
          if (a.type === 'stream') {
            sock.write('HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\nX-Zygo-Request-Id: req-s\r\n\r\n');
            for (const item of a.items) {
              const line = Buffer.from(JSON.stringify(item) + '\n');
              sock.write(`${line.length.toString(16)}\r\n`);
              sock.write(line);
              sock.write('\r\n');
              if (a.pause) await new Promise((r) => setTimeout(r, a.pause));
            }
            if (a.hang) return; // keep the connection open, answer unfinished
            sock.write('0\r\n\r\n');
            continue;
          }
          const raw = Buffer.isBuffer(a.body) ? a.body : Buffer.from(JSON.stringify(a.body));
          const hdrs = { 'Content-Type': 'application/json', 'X-Zygo-Request-Id': 'req-x', ...(a.headers || {}) };
          if (a.close) hdrs.Connection = 'close';
          let out = `HTTP/1.1 ${a.status} X\r\n` + Object.entries(hdrs).map(([k, v]) => `${k}: ${v}\r\n`).join('');
          if (a.chunked) {
            sock.write(out + 'Transfer-Encoding: chunked\r\n\r\n');
            for (let i = 0; i < raw.length; i += 7) {
              const piece = raw.subarray(i, i + 7);
              sock.write(`${piece.length.toString(16)}\r\n`);
              sock.write(piece);
              sock.write('\r\n');
            }
            sock.write('0\r\n\r\n');
          } else {
            sock.write(out + `Content-Length: ${raw.length}\r\n\r\n`);
            sock.write(raw);
          }
          if (a.close || a.hangupAfter) {
            done = true;
            sock.end();
            return;
          }
        }
      } finally {
        busy = false;
      }
    };
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      pump();
    });
  }
}

export async function withApi(fn, opts) {
  const api = await FakeAPI.start(opts);
  try {
    return await fn(api);
  } finally {
    await api.close();
  }
}
