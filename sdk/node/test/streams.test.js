import { test } from 'node:test';
import assert from 'node:assert/strict';

import * as zygo from '../index.js';
import { connect } from '../index.js';
import { withApi, reply, stream, defaultAnswer, RESULT } from './fake-api.js';

const D = 'sha256:' + 'ab'.repeat(32);

test('output, then the result', () =>
  withApi(async (api) => {
    api.handler = () =>
      stream([{ stream: 'stdout', data: 'loading\n' }, { stream: 'progress', data: '1 of 2' }, { stream: 'stderr', data: 'warn\n' }, { ...RESULT, status: 200, stdout: 'loading\n' }]);
    const items = [];
    for await (const ev of connect(api.url).stream('render', { pages: 2 }, { key: 'k1' })) items.push(ev);
    assert.deepEqual(items.slice(0, 3), [
      { kind: 'stdout', data: 'loading\n' },
      { kind: 'progress', data: '1 of 2' },
      { kind: 'stderr', data: 'warn\n' },
    ]);
    assert.equal(items[3].kind, 'result');
    assert.deepEqual(items[3].result.result, { ok: true });
    assert.equal(items[3].result.stdout, 'loading\n');
    const req = api.requests.at(-1);
    assert.deepEqual([req.path, req.query], ['/fn/render', { stream: '1' }]);
    assert.equal(req.headers['x-zygo-request-key'], 'k1');
  }));

test('a stream cut for reading slowly says so in its result', () =>
  withApi(async (api) => {
    api.handler = () => stream([{ stream: 'stdout', data: 'x' }, { ...RESULT, status: 200, stdout: 'xyz', stream_truncated: true }]);
    const c = connect(api.url);
    let items = [];
    for await (const ev of c.stream('spew')) items.push(ev);
    assert.deepEqual([items.at(-1).result.streamTruncated, items.at(-1).result.stdout], [true, 'xyz']);
    api.handler = () => stream([{ ...RESULT, status: 200 }]);
    items = [];
    for await (const ev of c.stream('f')) items.push(ev);
    assert.equal(items.at(-1).result.streamTruncated, false);
  }));

test('nothing is sent until iterated', () =>
  withApi(async (api) => {
    const it = connect(api.url).stream('render');
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(api.requests.length, 0);
    await it.next();
    assert.equal(api.requests.length, 1);
    await it.return();
  }));

test('a failed handler delivers its output, then throws', () =>
  withApi(async (api) => {
    api.handler = () => stream([{ stream: 'stdout', data: 'partial\n' }, { status: 500, error: 'ZeroDivisionError', code: 'handler', stdout: 'partial\n', exit_code: 1 }]);
    const it = connect(api.url).stream('render');
    assert.deepEqual((await it.next()).value, { kind: 'stdout', data: 'partial\n' });
    await assert.rejects(it.next(), (e) => e instanceof zygo.HandlerError && e.stdout === 'partial\n');
  }));

test('a refusal before anything ran throws at once', () =>
  withApi(async (api) => {
    api.handler = () => reply({ error: 'no function render', code: 'not_found' }, { status: 404 });
    await assert.rejects(connect(api.url).stream('render').next(), zygo.NotFound);
    api.handler = () => stream([{ status: 429, error: 'busy', code: 'busy' }]);
    await assert.rejects(connect(api.url, { retryBusy: false }).stream('render').next(), zygo.Busy);
    assert.equal(api.requests.length, 2);
  }));

test('a Busy stream is resent by default after its Retry-After, never after output', () =>
  withApi(async (api) => {
    let n = 0;
    api.handler = () => {
      n += 1;
      if (n === 1) return reply({ error: 'busy', code: 'busy' }, { status: 429, headers: { 'Retry-After': '2' } });
      if (n === 2) return stream([{ status: 429, error: 'busy', code: 'busy', retry_after: 3 }]);
      return stream([{ stream: 'stdout', data: 'x' }, { ...RESULT, status: 200 }]);
    };
    const c = connect(api.url);
    const slept = [];
    c._sleep = async (s) => {
      slept.push(s);
    };
    const kinds = [];
    for await (const ev of c.stream('render')) kinds.push(ev.kind);
    assert.deepEqual(kinds, ['stdout', 'result']);
    assert.deepEqual(slept, [2, 3]);
    assert.equal(api.requests.length, 3);
    api.requests.length = 0;
    api.handler = () => stream([{ stream: 'stdout', data: 'x' }, { status: 429, error: 'busy', code: 'busy' }]);
    const it = c.stream('render');
    assert.equal((await it.next()).value.kind, 'stdout');
    await assert.rejects(it.next(), zygo.Busy);
    assert.equal(api.requests.length, 1);
  }));

test('a Busy stream is resent when nothing was yielded', () =>
  withApi(async (api) => {
    let n = 0;
    api.handler = () => (++n === 1 ? stream([{ status: 429, error: 'busy', code: 'busy' }]) : stream([{ stream: 'stdout', data: 'x' }, { ...RESULT, status: 200 }]));
    const c = connect(api.url, { retries: 1, backoff: 0 });
    const kinds = [];
    for await (const ev of c.stream('render')) kinds.push(ev.kind);
    assert.deepEqual(kinds, ['stdout', 'result']);
    assert.equal(api.requests.length, 2);
  }));

test('a stream that ends without its result is a TransportError', () =>
  withApi(async (api) => {
    api.handler = () => stream([{ stream: 'stdout', data: 'x' }]);
    const it = connect(api.url).stream('render');
    await it.next();
    await assert.rejects(it.next(), zygo.TransportError);
  }));

test('leaving the loop closes the connection and does not cancel', () =>
  withApi(async (api) => {
    api.handler = (req) => (req.method === 'POST' ? stream([{ stream: 'stdout', data: '1' }, { stream: 'stdout', data: '2' }], { hang: true }) : defaultAnswer(req));
    const c = connect(api.url);
    for await (const ev of c.stream('render', null, { key: 'job' })) {
      assert.equal(ev.data, '1');
      break;
    }
    assert.ok(await api.waitFor(() => api.closedByClient === 1));
    assert.deepEqual(api.routes(), [['POST', '/fn/render']]);
    await c.functions();
    assert.equal(api.connections, 2, 'the stream connection was never pooled');
    c.close();
  }));

test('an AbortSignal cancels the request on the server', () =>
  withApi(async (api) => {
    let release;
    const held = new Promise((r) => (release = r));
    api.handler = async (req) => {
      if (req.method === 'POST') {
        await Promise.race([held, new Promise((r) => setTimeout(r, 5000))]);
        return reply({ error: 'cancelled', code: 'cancelled' }, { status: 499 });
      }
      release();
      return reply({ cancelled: 1 });
    };
    const c = connect(api.url);
    const controller = new AbortController();
    const call = c.call('render', { pages: 400 }, { signal: controller.signal });
    assert.ok(await api.waitFor(() => api.requests.length === 1));
    controller.abort();
    await assert.rejects(call, (e) => e.name === 'AbortError');
    const key = api.requests[0].headers['x-zygo-request-key'];
    assert.ok(key);
    assert.deepEqual(api.routes(), [['POST', '/fn/render'], ['DELETE', `/requests/${key}`]]);
  }));

test('an AbortSignal on a stream cancels too, with the given key', () =>
  withApi(async (api) => {
    api.handler = (req) => (req.method === 'POST' ? stream([{ stream: 'stdout', data: '1' }], { hang: true }) : reply({ cancelled: 1 }));
    const controller = new AbortController();
    const seen = [];
    await assert.rejects(
      (async () => {
        for await (const ev of connect(api.url).streamScript('py312', D, null, { key: 'job-4711', signal: controller.signal })) {
          seen.push(ev.data);
          controller.abort();
        }
      })(),
      (e) => e.name === 'AbortError',
    );
    assert.deepEqual(seen, ['1']);
    assert.deepEqual(api.routes().at(-1), ['DELETE', '/requests/job-4711']);
  }));

test('workspaces: a blob in the query for functions, inline or blob in the body for scripts; out decoded', () =>
  withApi(async (api) => {
    const tar = Buffer.from('pretend this is a tar\u0000\u00ff', 'latin1');
    api.handler = (req) => (req.method === 'POST' ? reply({ ...RESULT, workspace: tar.toString('base64') }) : defaultAnswer(req));
    const c = connect(api.url);
    const r = await c.call('convert', { to: 'png' }, { workspace: { sha256: 'sha256:' + 'cd'.repeat(32) }, out: true });
    assert.ok(Buffer.isBuffer(r.workspace));
    assert.deepEqual(r.workspace, tar);
    assert.deepEqual(api.requests.at(-1).query, { workspace: 'sha256:' + 'cd'.repeat(32), out: '1' });
    assert.ok(api.requests.at(-1).rawPath.includes('workspace=sha256:'));
    assert.throws(() => c.call('convert', null, { workspace: { inline: 'AAAA' } }), TypeError);
    await c.runScript('convert', D, { to: 'png' }, { workspace: { inline: tar.toString('base64') }, out: true });
    let body = api.requests.at(-1).json();
    assert.deepEqual(body.workspace, { inline: tar.toString('base64') });
    assert.equal(body.out, true);
    await c.runScript('convert', D, null, { workspace: { blob: 'sha256:' + 'cd'.repeat(32) } });
    assert.deepEqual(api.requests.at(-1).json().workspace, { blob: 'sha256:' + 'cd'.repeat(32) });
    await c.runScript('convert', null, null, { source: 'print(1)', workspace: tar });
    body = api.requests.at(-1).json();
    assert.equal(body.source, 'print(1)');
    assert.deepEqual(Buffer.from(body.workspace.inline, 'base64'), tar);
    assert.throws(() => c.runScript('convert'), TypeError);
  }));

test('putBlob and putScript send raw bytes', () =>
  withApi(async (api) => {
    const c = connect(api.url);
    const b = await c.putBlob(Buffer.from([1, 2, 3]));
    assert.deepEqual([...api.requests.at(-1).body], [1, 2, 3]);
    assert.equal(api.requests.at(-1).headers['content-type'], 'application/octet-stream');
    assert.match(b.sha256, /^sha256:/);
    const s = await c.putScript('export default (e) => e;\n');
    assert.equal(api.requests.at(-1).body.toString(), 'export default (e) => e;\n');
    assert.equal(s.size, 25);
  }));

test('started defaults to true when the answer has no such field', () =>
  withApi(async (api) => {
    const { started, ...noStarted } = RESULT;
    void started;
    api.handler = () => reply(noStarted);
    const c = connect(api.url);
    assert.equal((await c.call('f')).started, true);
    api.handler = () => reply({ exit_code: 0, stdout: '' });
    let r = await c.run(['true']);
    assert.equal(r.started, true);
    assert.equal(r.ok, true);
    api.handler = () => reply({ exit_code: null, started: false, phase: 'start', error: 'no image' });
    r = await c.run(['true']);
    assert.deepEqual([r.started, r.ok, r.phase], [false, false, 'start']);
  }));
