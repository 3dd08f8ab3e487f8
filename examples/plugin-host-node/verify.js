// Runs the Node plugin host against a real Zygo (ZYGO_API_URL, ZYGO_API_TOKEN with deploy
// rights; `make verify-plugin-host-node` starts one) and checks, through the host's own
// HTTP routes, what the layer exists for: a customer cannot run another's plugin by naming
// its digest, and a customer is held to its own memory limit rather than the runtime's.
// Prints one line per check; exits 1 when one fails.

import { randomUUID } from 'node:crypto';
import { createHost } from './server.js';

const PLUGIN = (owner) => `
import time
OWNER = ${JSON.stringify(owner)}

def handler(event):
    event = event or {}
    if event.get("hog_mb"):
        block = bytearray(event["hog_mb"] * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        return {"held_mb": event["hog_mb"]}
    if event.get("steps"):
        for n in range(event["steps"]):
            event.progress(f"{n + 1} of {event['steps']}")
            time.sleep(0.05)
        return {"steps": event["steps"]}
    if event.get("sleep"):
        time.sleep(event["sleep"])
    return {"owner": OWNER}
`;

const failures = [];
function check(name, ok, detail = '') {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}${detail ? ': ' + detail : ''}`);
  if (!ok) failures.push(name);
}

const u = randomUUID().slice(0, 6);
const [alice, bob] = [`alice${u}`, `bob${u}`];
const host = await createHost({ url: process.env.ZYGO_API_URL, token: process.env.ZYGO_API_TOKEN, runtimeMem: '256M' });
await new Promise((r) => host.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${host.address().port}`;
const post = (path, body) => fetch(base + path, { method: 'POST', body: typeof body === 'string' ? body : JSON.stringify(body) });
const onboarded = [];

try {
  for (const [id, mem] of [[alice, '64M'], [bob, undefined]]) {
    const r = await post('/customers', { id, mem });
    check(`onboard ${id}`, r.status === 200, `${r.status}`);
    onboarded.push(id);
  }
  const a = (await (await post(`/customers/${alice}/plugins`, PLUGIN(alice))).json()).digest;
  const b = (await (await post(`/customers/${bob}/plugins`, PLUGIN(bob))).json()).digest;
  const run = (who, digest, event, key) =>
    post(`/customers/${who}/plugins/${encodeURIComponent(digest)}/run${key ? `?key=${key}` : ''}`, event ?? {});

  let r = await run(alice, a);
  check('each customer runs its own plugin', r.status === 200 && (await r.json()).result.owner === alice);

  r = await run(bob, a);
  check("a customer cannot run another's plugin by its digest", r.status === 404, `${r.status} ${JSON.stringify(await r.json())}`);

  r = await run(bob, b, { hog_mb: 150 });
  check("the runtime's limit lets 150 MB through (bob, no limit of his own)", r.status === 200, `${r.status}`);
  r = await run(alice, a, { hog_mb: 150 });
  const body = await r.json();
  // killed at Alice's 64M, not at the runtime's 256M: its peak says which
  check('a customer is held to its own memory limit', r.status === 422 && body.oomKilled === true && body.peakRssKb !== null && body.peakRssKb <= 64 * 1024, `${r.status} ${JSON.stringify(body)}`);

  r = await post(`/customers/${alice}/plugins/${encodeURIComponent(a)}/stream`, { steps: 3 });
  const lines = (await r.text()).trim().split('\n').map((l) => JSON.parse(l));
  check('the stream route answers progress, then the result',
    JSON.stringify(lines.filter((l) => l.kind === 'progress').map((l) => l.data)) === JSON.stringify(['1 of 3', '2 of 3', '3 of 3']) &&
      lines.at(-1).kind === 'result', JSON.stringify(lines));

  const key = `stop-${u}`;
  const long = run(alice, a, { sleep: 20 }, key);
  let stopped = false;
  for (let i = 0; i < 200 && !stopped; i++) {
    const s = await fetch(`${base}/customers/${alice}/runs/${key}`, { method: 'DELETE' });
    stopped = s.status === 200;
    if (!stopped) await new Promise((res) => setTimeout(res, 50));
  }
  r = await long;
  check('a run is stopped by its key', stopped && r.status === 409, `${r.status}`);
} finally {
  for (const id of onboarded) {
    const r = await fetch(`${base}/customers/${id}`, { method: 'DELETE' });
    console.log(`offboarded ${id}: ${r.status} ${await r.text()}`);
  }
  await host.stopRuntime().catch(() => {});
  await new Promise((res) => host.close(res));
}
console.log('verify-plugin-host-node:', failures.length ? `FAILED ${failures.join(', ')}` : 'all checks passed');
process.exit(failures.length ? 1 : 0);
