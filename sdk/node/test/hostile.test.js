// Answers that are not what an API sends: each is a TransportError naming the problem,
// never a hang, another kind of crash, or a value made up from it.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { connect, TransportError, ZygoError } from '../index.js';
import { withApi, partial, reply, stream } from './fake-api.js';

const HOSTILE = {
  'not HTTP': 'SSH-2.0-OpenSSH_9.2\r\n\r\n',
  'a bad status line': 'HTTP/1.1 2xx OK\r\n\r\n',
  'a header line without a colon': 'HTTP/1.1 200 OK\r\nbroken\r\n\r\n',
  'headers over 64 KiB': 'HTTP/1.1 200 OK\r\nX: ' + 'a'.repeat(70000) + '\r\n\r\n',
  'a bad Content-Length': 'HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n',
  'a bad chunk size': 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',
  'a body shorter than its length': 'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}',
  'a 200 that is not JSON': 'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello',
};

test('each is a TransportError', async () => {
  for (const [name, data] of Object.entries(HOSTILE)) {
    await withApi(async (api) => {
      api.handler = () => partial(data);
      await assert.rejects(connect(api.url).call('f'), TransportError, name);
    });
  }
});

test('a stream line that is not JSON', () =>
  withApi(async (api) => {
    api.handler = () => stream(['not an object']);
    await assert.rejects(
      (async () => {
        for await (const _ of connect(api.url).stream('f')) void _;
      })(),
      TransportError,
    );
  }));

test('an answer of the wrong shape is an error, not a guess', () =>
  withApi(async (api) => {
    api.handler = () => reply({ result: 1, workspace: '!!not base64!!' });
    await assert.rejects(connect(api.url).call('f', null, { out: true }), ZygoError);
    api.handler = () => reply({ nothing: 'here' });
    await assert.rejects(connect(api.url).functions(), ZygoError);
    api.handler = () => reply({ result: 1, metrics: 'nope', stdout: 5, started: 'yes' });
    const r = await connect(api.url).call('f');
    assert.deepEqual([r.result, r.stdout, r.started, r.metrics.wallMs], [1, '', true, null]);
  }));
