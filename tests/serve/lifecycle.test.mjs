// A stream's life in dsv4 serve (docs/SERVER.md): the weights are paged in
// before /health says 200; a client that goes away
// mid-stream, or before a non-streamed answer is complete, cancels its
// request and its cache pages come back; a stream
// with nothing to send yet (waiting behind another request) gets SSE comment
// lines every --keepalive-seconds, then its answer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, readSSE, chatOf, sleep } from './server.mjs';

let s;
// One request at a time, so that a second one waits; keep-alives every second.
before(async () => { s = await startServer(['--parallel', '1', '--keepalive-seconds', '1', '--max-context', '2048']); });
after(async () => { if (s) await s.stop(); });

const long = (extra = {}) => ({
  model: 'default', messages: chatOf('Tell a long story.'), max_tokens: 1500, ignore_eos: true,
  temperature: 0, stream: true, ...extra,
});

// Reads SSE data lines from `response` until `n` have come, then aborts.
async function readThenAbort(response, controller, n) {
  const dec = new TextDecoder();
  let raw = '';
  const reader = response.body.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    raw += dec.decode(value, { stream: true });
    // Abort while the body is still open: cancelling the body instead lets
    // node's fetch drain the rest to keep the connection.
    if ((raw.match(/^data: /gm) || []).length >= n) {
      controller.abort();
      break;
    }
  }
  return raw;
}

// Polls /metrics every `every` ms until done(m); fails with `what` and the
// last metrics once `ms` have passed.
async function metricsWhen(done, ms, what, every = 100) {
  const deadline = Date.now() + ms;
  for (;;) {
    const m = await s.metrics();
    if (done(m)) return m;
    assert.ok(Date.now() < deadline, `${what}: ${JSON.stringify(m)}`);
    await sleep(every);
  }
}

test('the mapped weights are read while loading, before the server says it is ready', () => {
  const log = s.log(), read = /dsv4 serve: (\d+) MiB of weights read in [\d.]+ s\n/.exec(log);
  assert.ok(read, `no "weights read" line; stderr:\n${log}`);
  assert.ok(read.index < log.indexOf('dsv4 serve: model '), `read after ready; stderr:\n${log}`);
});

test('a client that disconnects mid-stream cancels its request and frees its pages', async () => {
  const before = await s.settled();
  const controller = new AbortController();
  const r = await fetch(s.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(long()),
    signal: controller.signal,
  });
  assert.equal(r.status, 200);
  await readThenAbort(r, controller, 4).catch(() => {});
  const m = await metricsWhen(
    (m) => m.dsv4_requests_cancelled_total > before.dsv4_requests_cancelled_total && m.dsv4_requests_running === 0,
    30e3, 'not cancelled 30 s after the disconnect');
  assert.equal(m.dsv4_requests_cancelled_total, before.dsv4_requests_cancelled_total + 1);
  assert.equal(m.dsv4_cache_pool_bytes_used, 0, 'the cancelled request\'s pages are back in the pool');
  assert.ok(m.dsv4_generated_tokens_total - before.dsv4_generated_tokens_total < 1500,
    'the request stopped long before its max_tokens');
});

test('a client that disconnects before a non-streamed answer cancels its request and frees its pages', async () => {
  const before = await s.settled();
  const controller = new AbortController();
  const answer = fetch(s.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(long({ stream: false })),
    signal: controller.signal,
  }).then((r) => r.text());
  // Drop the connection once the request runs and holds pages (its tokens
  // are counted only when it ends; nothing has come back yet).
  await metricsWhen((m) => m.dsv4_requests_running === 1 && m.dsv4_cache_pool_bytes_used > 0, 30e3,
    'the request did not start within 30 s', 20);
  await sleep(300);
  controller.abort();
  await answer.then(() => assert.fail('the answer came before the disconnect'), () => {});
  const m = await metricsWhen((m) => m.dsv4_requests_running === 0 && m.dsv4_cache_pool_bytes_used === 0, 10e3,
    'still running 10 s after the disconnect');
  assert.equal(m.dsv4_requests_cancelled_total, before.dsv4_requests_cancelled_total + 1);
  assert.ok(m.dsv4_generated_tokens_total - before.dsv4_generated_tokens_total < 1500,
    'the request stopped long before its max_tokens');
});

test('a waiting stream gets keep-alive comments, then its answer', async () => {
  // The first request holds the only place; the second waits behind it.
  const controller = new AbortController();
  const first = await fetch(s.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(long()),
    signal: controller.signal,
  });
  assert.equal(first.status, 200);
  const firstDone = readThenAbort(first, controller, 1e9).catch(() => {});
  const second = await s.post('/v1/chat/completions', long({ max_tokens: 4, ignore_eos: false }));
  assert.equal(second.status, 200);
  // Let the second wait ~3 s, then free the place by dropping the first.
  const waited = sleep(3000).then(() => controller.abort());
  const { events, comments, raw } = await readSSE(second);
  await waited;
  await firstDone;
  assert.ok(comments.length >= 2, `keep-alive comments while waiting: ${comments.length}`);
  for (const c of comments) assert.equal(c, ': keep-alive');
  const firstData = raw.indexOf('data: {');
  assert.ok(raw.indexOf(': keep-alive') < firstData, 'the comments came before the answer');
  assert.equal(events.at(-1), '[DONE]');
  assert.ok(events.slice(0, -1).some((e) => e.choices?.[0]?.finish_reason), 'the answer finished');
});
