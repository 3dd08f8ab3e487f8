import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { connect, TransportError } from '../index.js';
import { withApi } from './fake-api.js';

// A self-signed certificate for localhost, made with the openssl command.
function makeCert() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygo-sdk-node-tls-'));
  const cert = path.join(dir, 'cert.pem');
  const key = path.join(dir, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '2', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1'], { stdio: 'ignore' });
  const out = { cert: fs.readFileSync(cert), key: fs.readFileSync(key) };
  fs.rmSync(dir, { recursive: true, force: true });
  return out;
}

const { cert, key } = makeCert();

test('https with a trusted certificate', () =>
  withApi(
    async (api) => {
      const c = connect(api.url, { token: 't', tls: { ca: cert } });
      assert.deepEqual((await c.call('f')).result, { ok: true });
      assert.deepEqual((await c.call('f')).result, { ok: true });
      assert.equal(api.connections, 1);
      assert.equal(api.requests[0].headers.host, `localhost:${api.url.split(':').at(-1)}`);
      c.close();
    },
    { tls: { cert, key } },
  ));

test('an untrusted certificate is a TransportError', () =>
  withApi(
    async (api) => {
      await assert.rejects(connect(api.url).health(), (e) => e instanceof TransportError && /certificate/i.test(e.message));
    },
    { tls: { cert, key } },
  ));
