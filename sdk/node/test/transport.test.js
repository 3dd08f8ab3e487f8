import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';

import { connect, parseAddress, TransportError } from '../index.js';
import { withApi, reply, hangup, partial, RESULT, defaultAnswer } from './fake-api.js';

const pause = (ms) => new Promise((r) => setTimeout(r, ms));

test('every address form', () => {
  assert.deepEqual([parseAddress('unix:///run/zygo/api.sock').kind, parseAddress('unix:///run/zygo/api.sock').path], ['unix', '/run/zygo/api.sock']);
  const h = parseAddress('http://127.0.0.1:7700');
  assert.deepEqual([h.kind, h.host, h.port, h.tls], ['tcp', '127.0.0.1', 7700, false]);
  const s = parseAddress('https://zygo.internal:8443');
  assert.deepEqual([s.host, s.port, s.tls], ['zygo.internal', 8443, true]);
  assert.equal(parseAddress('https://zygo.internal').port, 443);
  const b = parseAddress('box:9000');
  assert.deepEqual([b.host, b.port, b.tls], ['box', 9000, false]);
  const v6 = parseAddress('http://[::1]:7700/prefix/');
  assert.deepEqual([v6.host, v6.port, v6.prefix], ['::1', 7700, '/prefix']);
  for (const bad of ['unix://relative.sock', 'ftp://x:1', 'box', 'box:0', 'box:99999', 'http://']) {
    assert.throws(() => parseAddress(bad), Error, bad);
  }
});

test('argument, then ZYGO_API_URL, then the default', () => {
  const saved = process.env.ZYGO_API_URL;
  try {
    process.env.ZYGO_API_URL = 'unix:///tmp/x.sock';
    assert.equal(connect().url, 'unix:///tmp/x.sock');
    assert.equal(connect('box:1').url, 'http://box:1');
    delete process.env.ZYGO_API_URL;
    assert.equal(connect().url, 'http://127.0.0.1:7700');
  } finally {
    if (saved === undefined) delete process.env.ZYGO_API_URL;
    else process.env.ZYGO_API_URL = saved;
  }
});

test('unknown options are refused', () => {
  assert.throws(() => connect(undefined, { retry: 3 }), /unknown option "retry"/);
});

test('headers: token, tenant, key, timeout in seconds', () =>
  withApi(async (api) => {
    const c = connect(api.url, { token: 'zygo_abc' });
    const r = await c.forTenant('acme').call('resize', { a: 1 }, { timeout: 2.5, key: 'job-1' });
    assert.deepEqual(r.result, { ok: true });
    assert.equal(r.metrics.wallMs, 1.5);
    assert.equal(r.requestId, 'req-1');
    const req = api.requests.at(-1);
    assert.equal(req.method, 'POST');
    assert.equal(req.path, '/fn/resize');
    assert.equal(req.headers.authorization, 'Bearer zygo_abc');
    assert.equal(req.headers['x-zygo-tenant'], 'acme');
    assert.equal(req.headers['x-zygo-request-key'], 'job-1');
    assert.equal(req.headers['x-zygo-timeout-ms'], '2500');
    assert.deepEqual(req.json(), { a: 1 });
    await c.call('resize');
    assert.equal(api.requests.at(-1).headers['x-zygo-tenant'], undefined);
    assert.equal(api.requests.at(-1).body.toString(), 'null');
    const f = c.fn('resize');
    assert.deepEqual((await f({ b: 2 })).result, { ok: true });
    c.close();
  }));

test('token from ZYGO_API_TOKEN unless one is given', () =>
  withApi(async (api) => {
    const saved = process.env.ZYGO_API_TOKEN;
    process.env.ZYGO_API_TOKEN = 'zygo_env';
    try {
      await connect(api.url).functions();
      assert.equal(api.requests.at(-1).headers.authorization, 'Bearer zygo_env');
      await connect(api.url, { token: 'zygo_arg' }).functions();
      assert.equal(api.requests.at(-1).headers.authorization, 'Bearer zygo_arg');
    } finally {
      if (saved === undefined) delete process.env.ZYGO_API_TOKEN;
      else process.env.ZYGO_API_TOKEN = saved;
    }
  }));

test('unix socket', () =>
  withApi(
    async (api) => {
      const c = connect(api.url);
      assert.deepEqual((await c.call('f')).result, { ok: true });
      assert.deepEqual((await c.call('f')).result, { ok: true });
      assert.equal(api.connections, 1);
      assert.equal(api.requests[0].headers.host, 'localhost');
      c.close();
    },
    { unix: true },
  ));

test('chunked answers, and connections reused', () =>
  withApi(async (api) => {
    api.handler = () => reply(RESULT, { chunked: true });
    const c = connect(api.url);
    for (let i = 0; i < 5; i++) assert.deepEqual((await c.call('f')).result, { ok: true });
    await c.forTenant('acme').call('f');
    assert.equal(api.connections, 1);
    c.close();
  }));

test('Connection: close is honoured', () =>
  withApi(async (api) => {
    api.handler = () => reply(RESULT, { close: true });
    const c = connect(api.url);
    await c.call('f');
    await c.call('f');
    assert.equal(api.connections, 2);
  }));

test('the pool is shared by concurrent calls', () =>
  withApi(async (api) => {
    const c = connect(api.url);
    const rs = await Promise.all(Array.from({ length: 40 }, (_, i) => c.call('f', i)));
    assert.equal(rs.length, 40);
    assert.deepEqual(api.requests.map((r) => r.json()).sort((a, b) => a - b), Array.from({ length: 40 }, (_, i) => i));
    assert.ok(api.connections <= 40);
    const before = api.connections;
    await Promise.all(Array.from({ length: 10 }, (_, i) => c.call('f', i)));
    assert.equal(api.connections, before, 'the second round reuses pooled connections');
    c.close();
  }));

test('a connection idle for more than 20 s is dropped', () =>
  withApi(async (api) => {
    const c = connect(api.url);
    let now = 1000;
    c._shared.pool.clock = () => now;
    await c.call('f');
    now += 19.5;
    await c.call('f');
    assert.equal(api.connections, 1);
    now += 20.5;
    await c.call('f');
    assert.equal(api.connections, 2);
    assert.ok(await api.waitFor(() => api.closedByClient >= 1), 'the stale connection was closed');
    assert.deepEqual(api.requests.map((r) => r.conn), [1, 1, 2]);
    c.close();
  }));

test('a reused connection that ends before the answer is retried once on a fresh one', () =>
  withApi(async (api) => {
    let n = 0;
    api.handler = (req) => (++n === 2 ? hangup() : reply(RESULT));
    const c = connect(api.url);
    await c.call('f', 1);
    assert.deepEqual((await c.call('f', 2)).result, { ok: true });
    assert.deepEqual(api.requests.map((r) => [r.conn, r.json()]), [[1, 1], [1, 2], [2, 2]]);
    c.close();
  }));

test('a reused connection reset before the answer is retried once', () =>
  withApi(async (api) => {
    let n = 0;
    api.handler = () => (++n === 2 ? hangup(true) : reply(RESULT));
    const c = connect(api.url);
    await c.call('f', 1);
    assert.deepEqual((await c.call('f', 2)).result, { ok: true });
    assert.deepEqual(api.requests.map((r) => [r.conn, r.json()]), [[1, 1], [1, 2], [2, 2]]);
    c.close();
  }));

test('a fresh connection that fails is a TransportError, sent once', () =>
  withApi(async (api) => {
    api.handler = () => hangup();
    await assert.rejects(connect(api.url).call('f'), TransportError);
    assert.equal(api.requests.length, 1);
  }));

test('the retry on a fresh connection is not retried again', () =>
  withApi(async (api) => {
    let n = 0;
    api.handler = () => (++n === 1 ? reply(RESULT) : hangup());
    const c = connect(api.url);
    await c.call('f', 1);
    await assert.rejects(c.call('f', 2), TransportError);
    assert.deepEqual(api.requests.map((r) => [r.conn, r.json()]), [[1, 1], [1, 2], [2, 2]]);
  }));

test('a failure after the first byte is never retried', () =>
  withApi(async (api) => {
    let n = 0;
    api.handler = () => (++n === 2 ? partial() : reply(RESULT));
    const c = connect(api.url);
    await c.call('f', 1);
    await assert.rejects(c.call('f', 2), (e) => e instanceof TransportError && /middle/.test(e.message));
    assert.deepEqual(api.requests.map((r) => [r.conn, r.json()]), [[1, 1], [1, 2]]);
  }));

test('nothing listening is a TransportError naming the address', async () => {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  await assert.rejects(connect(`127.0.0.1:${port}`).health(), (e) => e instanceof TransportError && e.message.includes(`127.0.0.1:${port}`));
});

test('an idle pooled connection does not keep the process alive', () =>
  withApi(async (api) => {
    const { execFile } = await import('node:child_process');
    const index = new URL('../index.js', import.meta.url).href;
    const script = `const m = await import(${JSON.stringify(index)}); await m.connect(${JSON.stringify(api.url)}).call('f');`;
    const started = Date.now();
    await new Promise((resolve, reject) =>
      execFile(process.execPath, ['--input-type=module', '-e', script], { timeout: 10000 }, (e) => (e ? reject(e) : resolve())),
    );
    assert.ok(Date.now() - started < 5000);
    assert.equal(api.requests.length, 1);
  }));

test('unknown answers fall through to defaultAnswer', () =>
  withApi(async (api) => {
    api.handler = (req) => defaultAnswer(req);
    assert.equal((await connect(api.url).health()).status, 'ok');
  }));

void pause;
