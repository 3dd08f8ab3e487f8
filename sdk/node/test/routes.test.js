// Every route of the API but GET /metrics and POST /mcp (MCP's transport, for MCP clients)
// has a method: the route list comes from the OpenAPI
// document the repository commits (spec/openapi.json) when it exists, else from
// sdk/routes.json; each route's method is called against the stand-in API and must send
// that route.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';

import { connect, Client } from '../index.js';
import { withApi, DIGEST } from './fake-api.js';

const OPENAPI = new URL('../../../spec/openapi.json', import.meta.url);
const FALLBACK = new URL('../../routes.json', import.meta.url);

export function apiRoutes() {
  let routes;
  let source;
  if (fs.existsSync(OPENAPI)) {
    const doc = JSON.parse(fs.readFileSync(OPENAPI, 'utf8'));
    routes = Object.entries(doc.paths).flatMap(([p, ops]) =>
      Object.keys(ops)
        .filter((m) => ['get', 'put', 'post', 'delete', 'patch'].includes(m))
        .map((m) => [m.toUpperCase(), p]),
    );
    source = OPENAPI.pathname;
  } else {
    routes = JSON.parse(fs.readFileSync(FALLBACK, 'utf8')).routes;
    source = FALLBACK.pathname;
  }
  const skipped = ['GET /metrics', 'POST /mcp'];
  return { source, routes: routes.filter(([m, p]) => !skipped.includes(`${m} ${p}`)) };
}

const METHODS = {
  'GET /healthz': ['health', (c) => c.health()],
  'GET /version': ['version', (c) => c.version()],
  'GET /fn': ['functions', (c) => c.functions()],
  'PUT /fn/{name}': ['serve', (c) => c.serve('f', { agent: 'python', entry: 'h.py:handler' }, { baseDir: '/srv' })],
  'DELETE /fn/{name}': ['stop', (c) => c.stop('f')],
  'POST /fn/{name}': ['call', (c) => c.call('f', { a: 1 })],
  'POST /fn/{name}/batch': ['batch', (c) => c.batch('f', [1, 2])],
  'GET /fn/{name}/logs': ['logs', (c) => c.logs('f', { limit: 5 })],
  'GET /fn/{name}/stats': ['stats', (c) => c.stats('f')],
  'POST /fn/{name}/warm': ['warm', (c) => c.warm('f', 2)],
  'POST /run': ['run', (c) => c.run(['echo', 'hi'], { mem: '64M', timeout: 5 })],
  'GET /runtimes': ['runtimes', (c) => c.runtimes()],
  'POST /runtimes': ['serveRuntime', (c) => c.serveRuntime('py312', { image: 'host', agent: 'python' }, { secrets: ['K'] })],
  'DELETE /runtimes/{name}': ['stopRuntime', (c) => c.stopRuntime('py312')],
  'POST /runtimes/{name}/call': ['runScript', (c) => c.runScript('py312', DIGEST, { n: 1 })],
  'PUT /scripts': ['putScript', (c) => c.putScript('print(1)')],
  'GET /scripts/{digest}': ['script', (c) => c.script(DIGEST)],
  'DELETE /scripts/{digest}': ['deleteScript', (c) => c.deleteScript(DIGEST)],
  'PUT /blobs': ['putBlob', (c) => c.putBlob(Buffer.from('tar'))],
  'DELETE /blobs/{digest}': ['deleteBlob', (c) => c.deleteBlob(DIGEST)],
  'POST /deps': ['putDeps', (c) => c.putDeps('python:3.12-slim', { 'requirements.txt': 'requests==2.32.3\n' })],
  'GET /deps': ['deps', (c) => c.deps()],
  'GET /deps/{id}': ['deps', (c) => c.deps('deps_1')],
  'DELETE /deps/{id}': ['deleteDeps', (c) => c.deleteDeps('deps_1')],
  'DELETE /requests/{key}': ['cancel', (c) => c.cancel('job-1')],
  'POST /tenants': ['createTenant', (c) => c.createTenant('acme')],
  'GET /tenants': ['tenants', (c) => c.tenants()],
  'GET /tenants/{id}': ['tenant', (c) => c.tenant('acme')],
  'DELETE /tenants/{id}': ['deleteTenant', (c) => c.deleteTenant('acme')],
  'PATCH /tenants/{id}/limits': ['setLimits', (c) => c.setLimits('acme', { mem: '256M', cpu: 0.5, timeout: 30 })],
  'GET /tenants/{id}/secrets': ['secrets', (c) => c.secrets('acme')],
  'PUT /tenants/{id}/secrets/{name}': ['putSecret', (c) => c.putSecret('acme', 'K', 'v')],
  'DELETE /tenants/{id}/secrets/{name}': ['deleteSecret', (c) => c.deleteSecret('acme', 'K')],
  'POST /tokens': ['mintToken', (c) => c.mintToken()],
  'POST /tenants/{id}/tokens': ['mintToken', (c) => c.mintToken('acme')],
  'GET /tokens': ['tokens', (c) => c.tokens()],
  'DELETE /tokens/{id}': ['revokeToken', (c) => c.revokeToken('tok_1')],
  'POST /drain': ['drain', (c) => c.drain({ grace: 5 })],
};

const templateRe = (t) => new RegExp('^' + t.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\\?\{[^}]+\\?\}/g, '[^/]+') + '$');

test('every route but GET /metrics and POST /mcp has a method', () =>
  withApi(async (api) => {
    const { source, routes } = apiRoutes();
    console.log(`routes read from ${source}`);
    assert.ok(routes.length > 20);
    const missing = routes.filter(([m, p]) => !METHODS[`${m} ${p}`]).map(([m, p]) => `${m} ${p}`);
    assert.deepEqual(missing, [], 'routes with no method in the Node client');
    const c = connect(api.url, { token: 't' });
    for (const [m, p] of routes) {
      const [name, invoke] = METHODS[`${m} ${p}`];
      assert.equal(typeof Client.prototype[name], 'function', name);
      const before = api.requests.length;
      await invoke(c);
      const sent = api.requests.slice(before);
      assert.equal(sent.length, 1, `${name} sent ${sent.length} requests`);
      assert.equal(sent[0].method, m, name);
      assert.match(sent[0].path, templateRe(p), name);
    }
    c.close();
  }));

test('setLimits sends only what was given; null clears', () =>
  withApi(async (api) => {
    await connect(api.url).setLimits('acme', { mem: '256M', pids: null, timeout: 1.5 });
    assert.deepEqual(api.requests.at(-1).json(), { mem: '256M', pids: null, timeout: '1500ms' });
  }));
