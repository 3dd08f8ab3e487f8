import { test } from 'node:test';
import assert from 'node:assert/strict';

import * as zygo from '../index.js';
import { connect } from '../index.js';
import { withApi, reply, RESULT } from './fake-api.js';

async function answer(status, body, headers = {}) {
  return withApi(async (api) => {
    api.handler = () => reply(body, { status, headers });
    try {
      // What each answer throws, as it comes (Busy is not sent again here).
      await connect(api.url, { retryBusy: false }).call('f');
    } catch (e) {
      return e;
    }
    throw new Error('no error');
  });
}

test('every status has its class', async () => {
  const cases = [
    [400, 'bad_request', zygo.BadRequest],
    [400, 'bad_spec', zygo.BadRequest],
    [400, 'missing_secret', zygo.BadRequest],
    [401, 'unauthorized', zygo.AuthError],
    [403, 'forbidden', zygo.AuthError],
    [404, 'not_found', zygo.NotFound],
    [408, 'api_timeout', zygo.Timeout],
    [429, 'busy', zygo.Busy],
    [499, 'cancelled', zygo.Cancelled],
    [500, 'handler', zygo.HandlerError],
    [503, 'unavailable', zygo.Unavailable],
    [504, 'timeout', zygo.Timeout],
    [504, 'stuck', zygo.Stuck],
  ];
  for (const [status, code, Cls] of cases) {
    const e = await answer(status, { error: `it was ${code}`, code });
    assert.equal(e.constructor, Cls, `${status} ${code}`);
    assert.ok(e instanceof zygo.ZygoError);
    assert.deepEqual([e.status, e.code, e.message, e.name], [status, code, `it was ${code}`, Cls.name]);
  }
});

test('409, 413, 422 and internal stay a plain ZygoError', async () => {
  for (const [status, code] of [[409, 'conflict'], [413, 'too_large'], [422, 'above_ceiling'], [500, 'internal']]) {
    const e = await answer(status, { error: 'x', code });
    assert.equal(e.constructor, zygo.ZygoError, code);
  }
});

test('HandlerError carries what the handler did', async () => {
  const e = await answer(500, { error: 'ValueError', code: 'handler', request_id: 'req-9', stdout: 'out', stderr: 'err', traceback: 'tb', exit_code: 3 });
  assert.deepEqual([e.stdout, e.stderr, e.exitCode, e.requestId, e.traceback, e.started], ['out', 'err', 3, 'req-9', 'tb', true]);
});

test('Busy carries retryAfter in seconds; request id from the header', async () => {
  const e = await answer(429, { error: 'busy', code: 'busy' }, { 'Retry-After': '2' });
  assert.equal(e.retryAfter, 2);
  assert.equal(e.requestId, 'req-x');
});

test('a body that is not JSON still names the status', async () => {
  const e = await answer(502, Buffer.from('<html>bad gateway</html>'));
  assert.equal(e.constructor, zygo.ZygoError);
  assert.match(e.message, /502/);
});

test('health: stopping throws Unavailable, degraded answers', () =>
  withApi(async (api) => {
    api.handler = () => reply({ status: 'stopping' }, { status: 503 });
    await assert.rejects(connect(api.url).health(), (e) => e instanceof zygo.Unavailable && /stopping/.test(e.message));
    api.handler = () => reply({ status: 'degraded', reason: 'pool below min_warm' });
    const h = await connect(api.url).health();
    assert.deepEqual([h.status, h.reason, h.ok], ['degraded', 'pool below min_warm', false]);
  }));

test('batch returns errors instead of throwing', () =>
  withApi(async (api) => {
    api.handler = () =>
      reply({ results: [{ ...RESULT, status: 200 }, { status: 429, error: 'busy', code: 'busy' }, { status: 500, error: 'boom', code: 'handler', stderr: 'tb' }] });
    const out = await connect(api.url).batch('f', [1, 2, 3]);
    assert.deepEqual(out[0].result, { ok: true });
    assert.ok(out[1] instanceof zygo.Busy);
    assert.ok(out[2] instanceof zygo.HandlerError);
    assert.equal(out[2].stderr, 'tb');
    assert.deepEqual(api.requests.at(-1).json(), { events: [1, 2, 3] });
  }));

// The first `n` requests are refused (`retryAfter` null: without Retry-After), each
// `took` seconds on the client's clock (see recording).
function refusing(api, n, status = 429, retryAfter = '0', took = 0, clock = null) {
  let count = 0;
  api.handler = () => {
    count += 1;
    if (count <= n) {
      if (clock) clock.now += took;
      const code = status === 429 ? 'busy' : 'unavailable';
      const headers = retryAfter === null ? {} : { 'Retry-After': retryAfter };
      return reply({ error: code, code }, { status, headers });
    }
    return reply(RESULT);
  };
}

// The waits `c` sleeps, on a clock of its own that moves only when it sleeps (or a
// test says the server took its time): the limits are exact.
function recording(c, clock = { now: 0 }) {
  const slept = [];
  c._sleep = async (s) => {
    slept.push(s);
    clock.now += s;
  };
  c._clock = () => clock.now;
  return slept;
}

test('Unavailable is not resent by default', () =>
  withApi(async (api) => {
    refusing(api, 1, 503);
    const c = connect(api.url);
    const slept = recording(c);
    await assert.rejects(c.call('f'), zygo.Unavailable);
    assert.equal(api.requests.length, 1);
    assert.deepEqual(slept, []);
  }));

test('Busy is resent by default after its Retry-After', () =>
  withApi(async (api) => {
    refusing(api, 2, 429, '2');
    const c = connect(api.url);
    const slept = recording(c);
    assert.deepEqual((await c.call('f')).result, { ok: true });
    assert.equal(api.requests.length, 3);
    assert.deepEqual(slept, [2, 2]);
  }));

test('a Busy wait is 1 s without Retry-After, at most 5 s, at least 0.1 s', () =>
  withApi(async (api) => {
    const slept = [];
    for (const ra of [null, '60', '0']) {
      refusing(api, 1, 429, ra);
      const c = connect(api.url);
      const waits = recording(c);
      await c.call('f');
      slept.push(...waits);
    }
    assert.deepEqual(slept, [1, 5, 0.1]);
    assert.equal(api.requests.length, 6);
  }));

test('retryBusy: false throws Busy as it comes', () =>
  withApi(async (api) => {
    refusing(api, 1, 429, '1');
    const c = connect(api.url, { retryBusy: false });
    const slept = recording(c);
    await assert.rejects(c.call('f'), (e) => e instanceof zygo.Busy && e.retryAfter === 1);
    assert.equal(api.requests.length, 1);
    assert.deepEqual(slept, []);
    assert.throws(() => connect(api.url, { retryBusy: 'no' }), /retryBusy is true or false/);
  }));

test('Busy is resent for at most 30 s, and never past the call\'s timeout', () =>
  withApi(async (api) => {
    refusing(api, 100, 429, '2');
    let c = connect(api.url);
    let slept = recording(c);
    await assert.rejects(c.call('f'), zygo.Busy);
    // Sent at 0, 2, …, 30 s: the next would go out past 30 s after the first.
    assert.deepEqual(slept, Array(15).fill(2));
    assert.equal(api.requests.length, 16);
    refusing(api, 100, 429, '2');
    c = connect(api.url);
    slept = recording(c);
    await assert.rejects(c.call('f', {}, { timeout: 5 }), zygo.Busy);
    assert.deepEqual(slept, [2, 2]);
    refusing(api, 100, 429, '2');
    c = connect(api.url, { timeout: 3 });
    slept = recording(c);
    await assert.rejects(c.call('f'), zygo.Busy);
    assert.deepEqual(slept, [2]);
  }));

test('a Busy that came after the whole wait is not resent', () =>
  withApi(async (api) => {
    // The API held the request in its queue for 30 s before it said busy.
    const clock = { now: 0 };
    refusing(api, 1, 429, '1', 30, clock);
    const c = connect(api.url);
    const slept = recording(c, clock);
    await assert.rejects(c.call('f'), zygo.Busy);
    assert.equal(api.requests.length, 1);
    assert.deepEqual(slept, []);
  }));

test('retries come first, then Busy is resent', () =>
  withApi(async (api) => {
    refusing(api, 3, 429, '0');
    const c = connect(api.url, { retries: 1, backoff: 0.5 });
    const slept = recording(c);
    await c.call('f');
    assert.deepEqual(slept, [0.5, 0.1, 0.1]);
  }));

test('Busy is resent, backoff doubling', () =>
  withApi(async (api) => {
    refusing(api, 3);
    const c = connect(api.url, { retries: 3, backoff: 0.5 });
    const slept = recording(c);
    assert.deepEqual((await c.call('f')).result, { ok: true });
    assert.equal(api.requests.length, 4);
    assert.deepEqual(slept, [0.5, 1, 2]);
  }));

test('Retry-After wins when it is longer; the last refusal is what the caller sees', () =>
  withApi(async (api) => {
    refusing(api, 2, 503, '3');
    let c = connect(api.url, { retries: 2, backoff: 2 });
    let slept = recording(c);
    await c.call('f');
    assert.deepEqual(slept, [3, 4]);
    api.requests.length = 0;
    refusing(api, 10, 429, '1');
    c = connect(api.url, { retries: 2, backoff: 0.1, retryBusy: false });
    slept = recording(c);
    await assert.rejects(c.call('f'), (e) => e instanceof zygo.Busy && e.retryAfter === 1);
    assert.equal(api.requests.length, 3);
  }));

test('other errors are never resent', () =>
  withApi(async (api) => {
    for (const [status, code, Cls] of [[500, 'handler', zygo.HandlerError], [504, 'timeout', zygo.Timeout], [404, 'not_found', zygo.NotFound]]) {
      api.requests.length = 0;
      api.handler = () => reply({ error: code, code }, { status });
      const c = connect(api.url, { retries: 3 });
      const slept = recording(c);
      await assert.rejects(c.call('f'), Cls);
      assert.equal(api.requests.length, 1);
      assert.deepEqual(slept, []);
    }
  }));

test('forTenant views keep the retry settings', () =>
  withApi(async (api) => {
    refusing(api, 1);
    const c = connect(api.url, { retries: 1, backoff: 0.25 });
    const slept = recording(c);
    await c.forTenant('acme').call('f');
    assert.deepEqual(slept, [0.25]);
    refusing(api, 1);
    await assert.rejects(connect(api.url, { retryBusy: false }).forTenant('acme').call('f'), zygo.Busy);
  }));
