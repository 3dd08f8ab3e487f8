// A plugin host as a node:http server, on the Zygo HTTP API alone. Customers are onboarded
// with an operator token (a tenant each, with its own token and limits); their plugins are
// registered and run through the customer's own token, in one runtime pool declared for all
// of them. One route streams as NDJSON; Zygo's errors become this server's own statuses.
//
//   POST   /customers       {"id": "acme", "mem": "64M", "secrets": {"API_KEY": "…"}}   onboard
//   DELETE /customers/:id                                                     offboard
//   POST   /customers/:id/plugins              (the plugin's source)          -> {"digest"}
//   POST   /customers/:id/plugins/:digest/run  (the event; ?key=K names it)  -> the result
//   POST   /customers/:id/plugins/:digest/stream                             -> NDJSON
//   DELETE /customers/:id/runs/:key                                           stop a run

import http from 'node:http';
import { connect, ZygoError, HandlerError, Timeout, Cancelled, NotFound, Busy, Unavailable, AuthError, BadRequest } from '../../sdk/node/index.js';

export const RUNTIME = 'plugins';

// Zygo's errors, as this host's own answers.
export function statusOf(e) {
  if (e instanceof HandlerError) return 422; // the plugin failed
  if (e instanceof Timeout) return 504;
  if (e instanceof Cancelled) return 409;
  if (e instanceof NotFound) return 404;
  if (e instanceof Busy) return 429;
  if (e instanceof Unavailable) return 503;
  if (e instanceof AuthError) return 403;
  if (e instanceof BadRequest) return 400;
  return 502;
}

function errorBody(e) {
  if (!(e instanceof ZygoError)) return { error: String(e?.message ?? e) };
  return { error: e.message, type: e.constructor.name, oomKilled: e.oomKilled, peakRssKb: e.body?.metrics?.peak_rss_kb ?? null, stderr: e.stderr, requestId: e.requestId };
}

async function readBody(req, cap = 1 << 20) {
  const parts = [];
  let n = 0;
  for await (const p of req) {
    n += p.length;
    if (n > cap) throw Object.assign(new Error('body too large'), { status: 413 });
    parts.push(p);
  }
  return Buffer.concat(parts);
}

export async function createHost({ url, token, runtimeMem = '256M' } = {}) {
  const op = connect(url, { token, retries: 3, backoff: 0.2 });
  await op.serveRuntime(RUNTIME, { agent: 'python', mem: runtimeMem, timeout: '30s', min_warm: 1, max_warm: 4 });
  const customers = new Map(); // id -> a client with the customer's own token

  const routes = [
    ['POST', /^\/customers$/, async (req) => {
      const { id, mem, secrets } = JSON.parse((await readBody(req)).toString() || '{}');
      await op.createTenant(id);
      if (mem) await op.setLimits(id, { mem });
      for (const [name, value] of Object.entries(secrets ?? {})) await op.putSecret(id, name, value);
      const minted = await op.mintToken(id);
      // A customer's Busy goes back to the host's own caller (429 with Zygo's Retry-After)
      // after three tries, rather than holding the host's request for up to 30 s.
      customers.set(id, connect(url, { token: minted.secret, retries: 3, backoff: 0.2, retryBusy: false }));
      return [200, { id }];
    }],
    ['DELETE', /^\/customers\/([^/]+)$/, async (req, [id]) => {
      const gone = await op.deleteTenant(id);
      customers.get(id)?.close();
      customers.delete(id);
      return [200, gone];
    }],
    ['POST', /^\/customers\/([^/]+)\/plugins$/, async (req, [id]) => {
      const s = await customer(id).putScript(await readBody(req));
      return [200, { digest: s.sha256 }];
    }],
    ['POST', /^\/customers\/([^/]+)\/plugins\/([^/]+)\/run$/, async (req, [id, digest], query) => {
      const body = (await readBody(req)).toString();
      const out = await customer(id).runScript(RUNTIME, digest, body ? JSON.parse(body) : null, { key: query.get('key') ?? undefined });
      return [200, { result: out.result, stdout: out.stdout, wallMs: out.metrics.wallMs }];
    }],
    ['POST', /^\/customers\/([^/]+)\/plugins\/([^/]+)\/stream$/, async (req, [id, digest], query, res) => {
      const body = (await readBody(req)).toString();
      const events = customer(id).streamScript(RUNTIME, digest, body ? JSON.parse(body) : null, { key: query.get('key') ?? undefined });
      let first;
      try {
        first = await events.next(); // a refusal before anything ran is an ordinary error answer
      } catch (e) {
        return [statusOf(e), errorBody(e)];
      }
      res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
      try {
        for (let it = first; !it.done; it = await events.next()) {
          const ev = it.value;
          res.write(JSON.stringify(ev.kind === 'result' ? { kind: 'result', result: ev.result.result } : ev) + '\n');
        }
      } catch (e) {
        res.write(JSON.stringify({ ...errorBody(e), kind: 'error', status: statusOf(e) }) + '\n');
      }
      res.end();
      return null;
    }],
    ['DELETE', /^\/customers\/([^/]+)\/runs\/([^/]+)$/, async (req, [id, key]) => [200, { stopped: await customer(id).cancel(key) }]],
  ];

  function customer(id) {
    const c = customers.get(id);
    if (!c) throw Object.assign(new Error(`no customer ${id}`), { status: 404 });
    return c;
  }

  const server = http.createServer(async (req, res) => {
    const u = new URL(req.url, 'http://host');
    const route = routes.find(([m, re]) => m === req.method && re.test(u.pathname));
    let answer;
    try {
      if (!route) answer = [404, { error: `no route ${req.method} ${u.pathname}` }];
      else {
        const params = route[1].exec(u.pathname).slice(1).map(decodeURIComponent);
        answer = await route[2](req, params, u.searchParams, res);
      }
    } catch (e) {
      answer = [e instanceof ZygoError ? statusOf(e) : (e.status ?? 500), errorBody(e)];
      if (e instanceof Busy || e instanceof Unavailable) res.setHeader('Retry-After', String(Math.ceil(e.retryAfter ?? 1)));
    }
    if (answer) {
      res.writeHead(answer[0], { 'Content-Type': 'application/json' });
      res.end(JSON.stringify(answer[1]));
    }
  });
  server.on('close', () => {
    for (const c of customers.values()) c.close();
    op.close();
  });
  server.stopRuntime = () => op.stopRuntime(RUNTIME);
  return server;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const port = Number(process.env.PORT || 8080);
  const server = await createHost({ url: process.env.ZYGO_API_URL, token: process.env.ZYGO_API_TOKEN });
  server.listen(port, '127.0.0.1', () => console.log(`plugin host on http://127.0.0.1:${port}`));
}
