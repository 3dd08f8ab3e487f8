// The client against a real `zygo api`, only with ZYGO_LIVE=1 (and ZYGO_API_URL,
// ZYGO_API_TOKEN). With that alone only the read-only check runs, so it may be pointed at
// any API; the rest serve, call, cancel, create and delete things, and run only against an
// API of the suite's own, which sdk/live.sh starts (a function `echo`, a bootstrap token
// with deploy rights) and says so with ZYGO_LIVE_OWN=1.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';

import { connect, HandlerError, NotFound, AuthError, Cancelled } from '../index.js';

const live = process.env.ZYGO_LIVE === '1';
const own = live && process.env.ZYGO_LIVE_OWN === '1';
const uniq = randomUUID().slice(0, 8);
const readOnly = { skip: live ? false : 'ZYGO_LIVE=1 runs it against a real API' };
const opts = { skip: own ? false : "ZYGO_LIVE=1 ZYGO_LIVE_OWN=1: against an API of the suite's own (sdk/live.sh)" };

test('health, version, functions (read only)', readOnly, async () => {
  const c = connect();
  assert.ok(['ok', 'degraded'].includes((await c.health()).status));
  assert.ok((await c.version()).version);
  assert.ok(Array.isArray(await c.functions()));
  c.close();
});

test('deploy rights and the function are there', opts, async () => {
  const c = connect();
  assert.equal(typeof (await c.version()).privateNet, 'boolean');
  assert.ok((await c.functions()).some((f) => f.name === 'echo'));
  c.close();
});

test('call, stream, batch, and the errors', opts, async () => {
  const c = connect();
  const r = await c.call('echo', { n: 1 }, { timeout: 20 });
  assert.deepEqual(r.result, { n: 1 });
  assert.match(r.stdout, /hello from echo/);
  assert.ok(r.requestId);
  // Fractional milliseconds: a fast call's wall time is more than 0 (it was whole ms, 0).
  assert.ok(r.metrics.wallMs > 0, `wallMs ${r.metrics.wallMs}`);
  assert.deepEqual((await c.fn('echo')([1, 2])).result, [1, 2]);
  const items = [];
  for await (const ev of c.stream('echo', { progress: true })) items.push(ev);
  assert.equal(items.at(-1).kind, 'result');
  assert.deepEqual(items.at(-1).result.result, { progress: true });
  assert.ok(items.some((e) => e.kind === 'progress' && e.data === 'half way'));
  assert.deepEqual((await c.batch('echo', [1, 2, 3])).map((x) => x.result), [1, 2, 3]);
  await assert.rejects(c.call('echo', { fail: true }), (e) => e instanceof HandlerError && /hello from echo/.test(e.stdout) && e.exitCode === null);
  // A handler whose process exited: the code it exited with.
  await assert.rejects(c.call('echo', { exit: 3 }), (e) => e instanceof HandlerError && e.exitCode === 3);
  await assert.rejects(c.call(`no-such-function-${uniq}`), NotFound);
  await assert.rejects(connect(undefined, { token: 'zygo_' + '0'.repeat(64) }).functions(), AuthError);
  c.close();
});

test('an AbortSignal cancels on the server; a key cancels from elsewhere', opts, async () => {
  const c = connect();
  const before = (await c.stats('echo')).cancelled ?? 0;
  const controller = new AbortController();
  const call = c.call('echo', { sleep: 15 }, { signal: controller.signal, timeout: 30 });
  setTimeout(() => controller.abort(), 1000);
  await assert.rejects(call, (e) => e.name === 'AbortError');
  let counted = false;
  for (let i = 0; i < 100 && !counted; i++) {
    counted = ((await c.stats('echo')).cancelled ?? 0) > before;
    if (!counted) await new Promise((r) => setTimeout(r, 100));
  }
  assert.ok(counted, 'the server counted the cancel');

  const key = `live-${uniq}`;
  // settled into a value at once: it is cancelled while the loop below is still running
  const keyed = c.call('echo', { sleep: 15 }, { key, timeout: 30 }).then(() => null, (e) => e);
  for (let i = 0; i < 200; i++) {
    try {
      assert.ok((await c.cancel(key)) >= 1);
      break;
    } catch (e) {
      if (!(e instanceof NotFound)) throw e;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  assert.ok((await keyed) instanceof Cancelled);
  c.close();
});

test('scripts, a pool, a tenant and its token', opts, async () => {
  const c = connect();
  const pool = `sdknode-${uniq}`;
  const tenant = `n${uniq}`;
  await c.serveRuntime(pool, { agent: 'python', min_warm: 1, max_warm: 2 });
  try {
    const source = `def handler(event):\n    return {'twice': event * 2}\n`;
    const s = await c.putScript(source);
    assert.match(s.sha256, /^sha256:/);
    assert.deepEqual((await c.runScript(pool, s.sha256, 21)).result, { twice: 42 });
    const t = await c.createTenant(tenant);
    assert.equal(t.created, true);
    try {
      const minted = await c.mintToken(tenant);
      const acme = connect(undefined, { token: minted.secret });
      assert.equal((await acme.tenant(tenant)).id, tenant);
      await assert.rejects(acme.tenants(), AuthError);
      await assert.rejects(acme.script(s.sha256), NotFound);
      const mine = await acme.putScript(`def handler(e):\n    return 'mine ${uniq}'\n`);
      assert.equal((await acme.runScript(pool, mine, null)).result, `mine ${uniq}`);
      await c.revokeToken(minted.id);
      await assert.rejects(acme.tenant(tenant), AuthError);
      acme.close();
    } finally {
      await c.deleteTenant(tenant);
    }
  } finally {
    await c.stopRuntime(pool);
    c.close();
  }
});

test('a dependency set: built, served to a pool, kept while in use, deleted', opts, async () => {
  const c = connect();
  // A requirements.txt with no requirement: a real build that fetches nothing.
  const d = await c.putDeps('host', { 'requirements.txt': `# node ${uniq}\n` });
  assert.match(d.id, /^deps_[0-9a-f]{64}$/);
  const deadline = Date.now() + 120_000;
  while ((await c.deps(d.id)).building && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 500));
  }
  assert.equal((await c.deps(d.id)).state, 'ready');
  assert.ok((await c.deps()).some((x) => x.id === d.id));
  const pool = `sdknodedeps-${uniq}`;
  await c.serveRuntime(pool, { agent: 'python' }, { deps: d.id });
  try {
    const r = await c.runScript(pool, null, null, { source: 'import sys\ndef handler(e):\n    return sys.prefix\n' });
    assert.equal(r.result, '/venv');
    await assert.rejects(c.deleteDeps(d.id), (e) => e.status === 409);
  } finally {
    await c.stopRuntime(pool);
  }
  await c.deleteDeps(d.id);
  await assert.rejects(c.deps(d.id), NotFound);
  c.close();
});
