// index.d.ts is written by hand; this reads it against the module as it runs, so that an
// export, a Client method or an option added without a declaration fails the suite (and a
// declaration left behind by a removed one does too).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';

import * as mod from '../index.js';
import { connect, Client } from '../index.js';
import { withApi, DIGEST } from './fake-api.js';

const dts = fs.readFileSync(new URL('../index.d.ts', import.meta.url), 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');

function block(startRe) {
  const m = startRe.exec(dts);
  assert.ok(m, `index.d.ts declares ${startRe}`);
  let depth = 0;
  for (let i = dts.indexOf('{', m.index); i < dts.length; i++) {
    if (dts[i] === '{') depth++;
    else if (dts[i] === '}' && --depth === 0) return { head: dts.slice(m.index, dts.indexOf('{', m.index)), body: dts.slice(dts.indexOf('{', m.index) + 1, i) };
  }
  throw new Error(`unbalanced ${startRe}`);
}

function topLevel(body) {
  // the members of a class or interface body, without what nested braces hold
  let depth = 0;
  let out = '';
  for (const ch of body) {
    if (ch === '{' || ch === '(' || ch === '<') depth++;
    if (depth === 0) out += ch;
    else if (ch === '\n') out += '\n';
    if (ch === '}' || ch === ')' || ch === '>') depth--;
    if (depth === 0 && (ch === ')' || ch === '}' || ch === '>')) out += ch === ')' ? '()' : '';
  }
  return out;
}

function interfaceFields(name) {
  const { head, body } = block(new RegExp(`export interface ${name}\\b`));
  const fields = new Set([...topLevel(body).matchAll(/^\s*(\w+)\??:/gm)].map((m) => m[1]));
  const ext = /extends\s+([\w, ]+)/.exec(head);
  if (ext) for (const parent of ext[1].split(',').map((s) => s.trim())) for (const f of interfaceFields(parent)) fields.add(f);
  return fields;
}

const declaredExports = new Set([...dts.matchAll(/^export declare (?:const|function|class) (\w+)/gm)].map((m) => m[1]));
if (/^export default /m.test(dts)) declaredExports.add('default');

const clientBody = topLevel(block(/export declare class Client\b/).body);
const declaredMethods = new Map();
for (const line of block(/export declare class Client\b/).body.split('\n')) {
  const m = /^\s{2}(\w+)(?:<[^>]*>)?\((.*)\):/.exec(line);
  if (!m || m[1] === 'constructor') continue;
  const opt = /options\?: (\w+)/.exec(m[2]);
  const prev = declaredMethods.get(m[1]);
  declaredMethods.set(m[1], prev ?? (opt ? opt[1] : null));
}
const declaredProps = new Set([...clientBody.matchAll(/^\s*(?:readonly\s+)?(\w+):/gm)].map((m) => m[1]));

test('every export is declared, and every declared export exists', () => {
  const actual = new Set(Object.keys(mod));
  assert.deepEqual([...actual].filter((k) => !declaredExports.has(k)), [], 'exported but not declared in index.d.ts');
  assert.deepEqual([...declaredExports].filter((k) => !actual.has(k)), [], 'declared in index.d.ts but not exported');
  for (const k of declaredExports) {
    const kind = new RegExp(`^export declare (const|function|class) ${k}\\b`, 'm').exec(dts)?.[1];
    if (kind === 'function' || kind === 'class') assert.equal(typeof mod[k], 'function', k);
  }
  assert.equal(mod.default.connect, connect);
  for (const e of ['ZygoError', 'AuthError', 'NotFound', 'Busy', 'Unavailable', 'HandlerError', 'Timeout', 'Cancelled', 'Stuck', 'TransportError', 'BadRequest']) {
    assert.ok(declaredExports.has(e), e);
    if (e !== 'ZygoError') assert.ok(new RegExp(`class ${e} extends ZygoError`).test(dts), `${e} extends ZygoError`);
  }
});

test('every Client method and getter is declared, and every declared one exists', () => {
  const proto = Client.prototype;
  const names = Object.getOwnPropertyNames(proto).filter((n) => n !== 'constructor' && !n.startsWith('_'));
  const missing = names.filter((n) => {
    const d = Object.getOwnPropertyDescriptor(proto, n);
    return typeof d.value === 'function' ? !declaredMethods.has(n) : !declaredProps.has(n);
  });
  assert.deepEqual(missing, [], 'Client members not declared in index.d.ts');
  const gone = [...declaredMethods.keys()].filter((n) => typeof proto[n] !== 'function');
  assert.deepEqual(gone, [], 'declared Client methods the module does not have');
  const c = connect('box:1');
  for (const p of declaredProps) assert.ok(p in c, `declared property ${p}`);
});

function recorder() {
  const read = new Set();
  const proxy = new Proxy(
    {},
    {
      get(_t, k) {
        if (typeof k === 'string') read.add(k);
        return undefined;
      },
    },
  );
  return { proxy, read };
}

// How to call each method that takes options, so that the options it reads are seen.
const CALLS = {
  drain: (c, o) => c.drain(o),
  serve: (c, o) => c.serve('f', { agent: 'python' }, o),
  call: (c, o) => c.call('f', null, o),
  batch: (c, o) => c.batch('f', [1], o),
  stream: async (c, o) => {
    for await (const _ of c.stream('f', null, o)) void _;
  },
  logs: (c, o) => c.logs('f', o),
  run: (c, o) => c.run(['true'], o),
  serveRuntime: (c, o) => c.serveRuntime('py', { agent: 'python' }, o),
  runScript: (c, o) => c.runScript('py', DIGEST, null, o),
  streamScript: async (c, o) => {
    for await (const _ of c.streamScript('py', DIGEST, null, o)) void _;
  },
  fn: (c, o) => c.fn('f')(null, o),
};

test('every option a call reads is declared, and every declared option is read', () =>
  withApi(async (api) => {
    const c = connect(api.url);
    const withOptions = [...declaredMethods].filter(([, t]) => t);
    for (const [name, type] of withOptions) {
      assert.ok(CALLS[name], `types.test.js knows how to call ${name}`);
      const { proxy, read } = recorder();
      await CALLS[name](c, proxy);
      const declared = interfaceFields(type);
      assert.deepEqual([...read].filter((k) => !declared.has(k)), [], `${name} reads options ${type} does not declare`);
      assert.deepEqual([...declared].filter((k) => !read.has(k)), [], `${type} declares options ${name} never reads`);
    }
    const { proxy, read } = recorder();
    connect(api.url, proxy);
    const declared = interfaceFields('ConnectOptions');
    assert.deepEqual([...read].filter((k) => !declared.has(k)), [], 'connect reads options ConnectOptions does not declare');
    assert.deepEqual([...declared].filter((k) => !read.has(k)), [], 'ConnectOptions declares options connect never reads');
    // setLimits takes every Limits key and refuses others
    const limits = Object.fromEntries([...interfaceFields('Limits')].map((k) => [k, null]));
    await c.setLimits('acme', limits);
    assert.deepEqual(Object.keys(api.requests.at(-1).json()).sort(), [...interfaceFields('Limits')].sort());
    assert.throws(() => c.setLimits('acme', { memory: '1G' }), TypeError);
    c.close();
  }));
