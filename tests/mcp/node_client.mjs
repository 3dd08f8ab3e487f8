// Drive `zygo mcp` with the official MCP TypeScript SDK, as an agent host does.
//
// Run by tests/tests/mcp.rs with NODE_PATH unset and the node_modules folder made by
// tests/mcp/setup.sh as the working directory's sibling (see --modules):
//   @modelcontextprotocol/sdk 1.x     the handshake revisions (it asks for 2025-11-25; with
//                                     --revision the initialize it sends is rewritten to ask
//                                     for another, as an older client would)
//   @modelcontextprotocol/client 2.x  the stateless 2026-07-28 revision
//
//   node node_client.mjs --modules DIR --zygo PATH [--revision REV] SCENARIO [-- ZYGO_MCP_ARGS...]
//
// Scenarios: basics, limits, cancel, functions (sdk 1.x); stateless (client 2.x).
// zygo mcp gets this process's ZYGO_* variables. On success one JSON line of observations
// is printed and the exit code is 0; the first failed check prints FAILED: ... and exits 1.

import { pathToFileURL } from 'node:url';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

const argv = process.argv.slice(2);
const opts = { zygoArgs: [] };
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--modules') opts.modules = argv[++i];
  else if (a === '--zygo') opts.zygo = argv[++i];
  else if (a === '--revision') opts.revision = argv[++i];
  else if (a === '--') { opts.zygoArgs = argv.slice(i + 1); break; }
  else opts.scenario = a;
}

function check(cond, what, got) {
  if (!cond) {
    console.error(`FAILED: ${what}: ${JSON.stringify(got)}`);
    process.exit(1);
  }
}

const TOOLS = ['run_code', 'list_functions', 'call_function', 'function_logs'];
const NO_SUPERVISOR = 'no supervisor is running; start one with `zygo up`';

async function load(spec) {
  // Resolve a package from the SDK folder, not from this script's location.
  const [pkg, sub] = spec.startsWith('@') ? [spec.split('/').slice(0, 2).join('/'), spec.split('/').slice(2).join('/')] : [spec, ''];
  const dir = path.join(opts.modules, pkg);
  const meta = JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8'));
  let file;
  const key = sub ? `./${sub}` : '.';
  const exp = meta.exports?.[key];
  if (exp) {
    const imp = exp.import ?? exp;
    file = typeof imp === 'string' ? imp : (imp.default ?? imp.node?.import ?? imp.node);
  } else if (meta.exports?.['./*']) {
    const pat = meta.exports['./*'];
    const imp = pat.import ?? pat;
    file = (typeof imp === 'string' ? imp : imp.default).replace('*', sub);
  } else {
    file = sub || meta.main;
  }
  return { mod: await import(pathToFileURL(path.join(dir, file)).href), version: meta.version };
}

function env() {
  const e = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('ZYGO_') || k === 'PATH' || k === 'HOME') e[k] = v;
  }
  return e;
}

// A transport wrapper that records every message and can make initialize ask for another
// revision.
function recording(inner, revision) {
  const log = { sent: [], received: [] };
  const t = {
    log,
    async start() { return inner.start(); },
    async close() { return inner.close(); },
    async send(msg, o) {
      if (revision && msg.method === 'initialize') msg = { ...msg, params: { ...msg.params, protocolVersion: revision } };
      log.sent.push(msg);
      return inner.send(msg, o);
    },
    set onmessage(f) { inner.onmessage = (m, extra) => { log.received.push(m); f(m, extra); }; },
    get onmessage() { return inner.onmessage; },
    set onclose(f) { inner.onclose = f; },
    get onclose() { return inner.onclose; },
    set onerror(f) { inner.onerror = f; },
    get onerror() { return inner.onerror; },
    get sessionId() { return inner.sessionId; },
  };
  return t;
}

function structured(r) {
  const text = JSON.parse(r.content[0].text);
  if (r.structuredContent !== undefined) {
    check(JSON.stringify(text) === JSON.stringify(r.structuredContent), 'the text block holds the structured result', r);
    return r.structuredContent;
  }
  return text;
}

function procWith(args) {
  const want = args.join('\0') + '\0';
  const pids = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readFileSync(`/proc/${name}/cmdline`, 'latin1') === want) pids.push(Number(name));
    } catch { /* gone */ }
  }
  return pids;
}

async function waitFor(pred, seconds, what) {
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    if (pred()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  check(false, what, `not within ${seconds}s`);
}

async function runCode(client, language, code, stdin) {
  const args = { language, code };
  if (stdin !== undefined) args.stdin = stdin;
  const r = await client.callTool({ name: 'run_code', arguments: args });
  return [r, structured(r)];
}

async function v1Client() {
  const { mod: clientMod, version } = await load('@modelcontextprotocol/sdk/client/index.js');
  const { mod: stdioMod } = await load('@modelcontextprotocol/sdk/client/stdio.js');
  const inner = new stdioMod.StdioClientTransport({
    command: opts.zygo, args: ['mcp', ...opts.zygoArgs], env: env(), stderr: 'inherit',
  });
  const transport = recording(inner, opts.revision);
  const client = new clientMod.Client({ name: 'zygo-test', version: '1.0.0' });
  await client.connect(transport);
  const init = transport.log.received.find((m) => m.id !== undefined && m.result?.protocolVersion);
  return { client, transport, version, revision: init?.result?.protocolVersion };
}

async function basics() {
  const { client, version, revision } = await v1Client();
  if (opts.revision) check(revision === opts.revision, 'negotiated the revision asked for', revision);
  const tools = (await client.listTools()).tools;
  check(JSON.stringify(tools.map((t) => t.name)) === JSON.stringify(TOOLS), 'the four tools', tools);
  const structuredRev = revision >= '2025-06-18';
  for (const t of tools) check((t.outputSchema !== undefined) === structuredRev, 'outputSchema where the revision has it', t);
  check(client.getInstructions().includes('Prefer a warm function over run_code'), 'instructions', client.getInstructions());

  let [r, v] = await runCode(client, 'javascript', "require('fs').writeFileSync('note.txt', 'kept'); console.log('js', 6 * 7)");
  check(!r.isError && v.stdout === 'js 42\n', 'javascript runs', v);
  [r, v] = await runCode(client, 'python', "print('py', open('note.txt').read())");
  check(!r.isError && v.stdout === 'py kept\n', 'python runs and /work persists', v);
  [r, v] = await runCode(client, 'sh', 'read x; echo "sh $x in $(pwd)"', 'hi');
  check(!r.isError && v.stdout === 'sh hi in /work\n', 'sh runs with stdin', v);
  [r, v] = await runCode(client, 'javascript', 'throw new Error("boom")');
  check(r.isError && v.exit_code === 1 && v.stderr.includes('/zygo/main.js') && v.stderr.includes('boom'), 'a JS error names the real file', v);

  let widening;
  try {
    r = await client.callTool({ name: 'run_code', arguments: { language: 'sh', code: 'true', image: 'ubuntu' } });
    check(revision >= '2025-11-25' && r.isError, 'a widening argument is refused', r);
    widening = 'tool error';
  } catch (e) {
    check(revision < '2025-11-25', 'a protocol error only before 2025-11-25', String(e));
    widening = 'protocol error';
  }
  let unknown;
  try {
    await client.callTool({ name: 'no_such_tool', arguments: {} });
    check(false, 'an unknown tool is a protocol error', 'it answered');
  } catch (e) { unknown = String(e.message); }
  r = await client.callTool({ name: 'list_functions', arguments: {} });
  // In words, naming the socket it looked for.
  check(r.isError && structured(r).error.startsWith(NO_SUPERVISOR)
    && structured(r).error.includes('zygo.sock'), 'no supervisor, in words', r);
  await client.close();
  return { ok: true, sdk: version, revision, widening, unknown_tool: unknown };
}

async function limits() {
  const { client, version } = await v1Client();
  let [r, v] = await runCode(client, 'javascript', 'const a = []; for (;;) a.push(Buffer.alloc(16 << 20, 1));');
  check(r.isError && v.oom_killed && v.error === 'ran out of memory (limit 64M)', 'an OOM kill, in words', v);
  [r, v] = await runCode(client, 'python', 'import time\nprint("before", flush=True)\ntime.sleep(30)');
  check(r.isError && v.timed_out && v.error === 'exceeded its 2s time limit' && v.stdout === 'before\n', 'a timeout, in words', v);
  await client.close();
  return { ok: true, sdk: version };
}

async function cancel() {
  const { client, transport, version } = await v1Client();
  const marker = ['sleep', `42.${process.pid}`];
  const ac = new AbortController();
  const call = client.callTool(
    { name: 'run_code', arguments: { language: 'sh', code: `echo started > started; ${marker.join(' ')}; echo done > done` } },
    undefined, { signal: ac.signal, timeout: 120000 });
  await waitFor(() => procWith(marker).length > 0, 20, 'the sandbox started');
  const t0 = Date.now();
  ac.abort('the user pressed stop');
  try { await call; check(false, 'an aborted call rejects', 'it resolved'); } catch { /* expected */ }
  await waitFor(() => procWith(marker).length === 0, 10, 'the cancelled sandbox is gone');
  const gone = (Date.now() - t0) / 1000;
  const sentCancel = transport.log.sent.find((m) => m.method === 'notifications/cancelled');
  check(sentCancel, 'the SDK sent notifications/cancelled', transport.log.sent.map((m) => m.method));
  const [, v] = await runCode(client, 'sh', 'ls');
  check(v.stdout.split(/\s+/).filter(Boolean).join(',') === 'started', 'the cancelled program stopped before its end', v);
  const answered = transport.log.received.some((m) => m.id === sentCancel.params.requestId);
  check(!answered, 'a cancelled request gets no answer', transport.log.received);
  await client.close();
  return { ok: true, sdk: version, gone_after_s: gone };
}

async function functions() {
  const { client, version } = await v1Client();
  let r = await client.callTool({ name: 'list_functions', arguments: {} });
  check(!r.isError && structured(r).functions.some((f) => f.name === 'hello' && f.state === 'serving'), 'hello is served', r);
  r = await client.callTool({ name: 'call_function', arguments: { name: 'hello', event: { name: 'node' } } });
  let v = structured(r);
  check(!r.isError && JSON.stringify(v.result) === '{"greeting":"hello node"}', 'call_function works', v);
  r = await client.callTool({ name: 'function_logs', arguments: { name: 'hello', limit: 3 } });
  v = structured(r);
  check(!r.isError && v.entries.length >= 1 && v.entries.length <= 3, 'function_logs', v);
  await client.close();
  return { ok: true, sdk: version, result: { greeting: 'hello node' } };
}

async function stateless() {
  const { mod: c, version } = await load('@modelcontextprotocol/client');
  const { mod: stdio } = await load('@modelcontextprotocol/client/stdio');
  const transport = new stdio.StdioClientTransport({
    command: opts.zygo, args: ['mcp', ...opts.zygoArgs], env: env(), stderr: 'inherit',
  });
  const client = new c.Client({ name: 'zygo-test', version: '2.0.0' }, { versionNegotiation: { mode: 'auto' } });
  await client.connect(transport);
  check(client.getProtocolEra() === 'modern', 'the stateless era', client.getProtocolEra());
  const revision = client.getNegotiatedProtocolVersion();
  check(revision === '2026-07-28', 'the stateless revision', revision);
  const d = client.getDiscoverResult();
  check(d && d.supportedVersions.includes('2026-07-28'), 'server/discover', d);
  const tools = (await client.listTools()).tools;
  check(JSON.stringify(tools.map((t) => t.name)) === JSON.stringify(TOOLS), 'the four tools', tools);
  let [r, v] = await runCode(client, 'javascript', "require('fs').writeFileSync('n', '7'); console.log(6 * 7)");
  check(!r.isError && v.stdout === '42\n', 'javascript runs', v);
  [r, v] = await runCode(client, 'sh', 'cat n');
  check(v.stdout === '7', '/work persists', v);
  const obs = { ok: true, sdk: version, revision };
  if (process.env.ZYGO_TEST_FUNCTIONS) {
    r = await client.callTool({ name: 'call_function', arguments: { name: 'hello', event: { name: 'ts' } } });
    v = structured(r);
    check(!r.isError && JSON.stringify(v.result) === '{"greeting":"hello ts"}', 'a warm function', v);
    obs.function = v.result;
  }
  await client.close();
  return obs;
}

const scenarios = { basics, limits, cancel, functions, stateless };
check(opts.zygo && opts.modules && scenarios[opts.scenario], 'usage: --modules DIR --zygo PATH SCENARIO', argv);
const timer = setTimeout(() => { console.error('FAILED: the scenario took over 90s'); process.exit(1); }, 90000);
try {
  const obs = await scenarios[opts.scenario]();
  clearTimeout(timer);
  console.log(JSON.stringify(obs));
  process.exit(0);
} catch (e) {
  console.error(`FAILED: ${e?.stack ?? e}`);
  process.exit(1);
}
