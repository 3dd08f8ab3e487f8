// The plugin host against a fake Zygo (the Node SDK's stand-in API).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { createHost } from '../server.js';
import { FakeAPI, defaultAnswer, reply, stream } from '../../../sdk/node/test/fake-api.js';

async function withHost(fn) {
  const api = await FakeAPI.start();
  const host = await createHost({ url: api.url, token: 'op' });
  await new Promise((r) => host.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${host.address().port}`;
  try {
    await fn(api, base);
  } finally {
    await new Promise((r) => host.close(r));
    await api.close();
  }
}

const post = (url, body) => fetch(url, { method: 'POST', body: typeof body === 'string' ? body : JSON.stringify(body) });

test('onboard, install, run, stop, offboard', () =>
  withHost(async (api, base) => {
    assert.deepEqual(api.routes()[0], ['POST', '/runtimes']);
    let r = await post(`${base}/customers`, { id: 'acme', mem: '64M', secrets: { API_KEY: 'k1' } });
    assert.equal(r.status, 200);
    assert.deepEqual(api.routes().slice(1), [
      ['POST', '/tenants'],
      ['PATCH', '/tenants/acme/limits'],
      ['PUT', '/tenants/acme/secrets/API_KEY'],
      ['POST', '/tenants/acme/tokens'],
    ]);
    assert.deepEqual(api.requests[3].json(), { value: 'k1' });
    r = await post(`${base}/customers/acme/plugins`, 'def handler(e):\n    return e\n');
    const { digest } = await r.json();
    assert.match(digest, /^sha256:/);
    // the plugin is registered with the customer's own token, not the operator's
    assert.equal(api.requests.at(-1).headers.authorization, 'Bearer zygo_' + '0'.repeat(64));
    r = await post(`${base}/customers/acme/plugins/${encodeURIComponent(digest)}/run?key=k1`, { n: 1 });
    assert.equal(r.status, 200);
    assert.deepEqual((await r.json()).result, { ok: true });
    assert.equal(api.requests.at(-1).headers['x-zygo-request-key'], 'k1');
    assert.deepEqual(api.requests.at(-1).json(), { script: digest, event: { n: 1 } });
    r = await fetch(`${base}/customers/acme/runs/k1`, { method: 'DELETE' });
    assert.deepEqual(await r.json(), { stopped: 1 });
    r = await fetch(`${base}/customers/acme`, { method: 'DELETE' });
    assert.equal(r.status, 200);
    assert.deepEqual(api.routes().at(-1), ['DELETE', '/tenants/acme']);
    r = await post(`${base}/customers/acme/plugins`, 'x');
    assert.equal(r.status, 404);
  }));

test("Zygo's errors become the host's statuses", () =>
  withHost(async (api, base) => {
    await post(`${base}/customers`, { id: 'acme' });
    const cases = [
      [500, 'handler', 422],
      [504, 'timeout', 504],
      [499, 'cancelled', 409],
      [404, 'not_found', 404],
      [429, 'busy', 429],
      [503, 'unavailable', 503],
    ];
    for (const [status, code, mine] of cases) {
      api.handler = (req) => (req.path.endsWith('/call') ? reply({ error: code, code, oom_killed: code === 'handler' }, { status, headers: { 'Retry-After': '0' } }) : defaultAnswer(req));
      const r = await post(`${base}/customers/acme/plugins/sha256:${'ab'.repeat(32)}/run`, {});
      assert.equal(r.status, mine, code);
      const body = await r.json();
      assert.equal(body.error, code);
      if (code === 'handler') assert.equal(body.oomKilled, true);
      if (code === 'busy') assert.equal(r.headers.get('retry-after'), '0'); // Zygo's own, passed on
    }
  }));

test('the stream route answers NDJSON, an error as its last line', () =>
  withHost(async (api, base) => {
    await post(`${base}/customers`, { id: 'acme' });
    api.handler = (req) =>
      req.path.endsWith('/call')
        ? stream([{ stream: 'progress', data: '1 of 2' }, { stream: 'stdout', data: 'x\n' }, { status: 500, error: 'boom', code: 'handler' }])
        : defaultAnswer(req);
    const r = await post(`${base}/customers/acme/plugins/sha256:${'ab'.repeat(32)}/stream`, {});
    assert.equal(r.headers.get('content-type'), 'application/x-ndjson');
    const lines = (await r.text()).trim().split('\n').map((l) => JSON.parse(l));
    assert.deepEqual(lines.slice(0, 2), [{ kind: 'progress', data: '1 of 2' }, { kind: 'stdout', data: 'x\n' }]);
    assert.equal(lines[2].kind, 'error');
    assert.equal(lines[2].status, 422);
    api.handler = (req) => (req.path.endsWith('/call') ? reply({ error: 'no such script', code: 'not_found' }, { status: 404 }) : defaultAnswer(req));
    const refused = await post(`${base}/customers/acme/plugins/sha256:${'ab'.repeat(32)}/stream`, {});
    assert.equal(refused.status, 404);
  }));
