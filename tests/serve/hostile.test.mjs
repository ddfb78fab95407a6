// dsv4 serve against bad input (docs/SERVER.md, "Errors"): one test per row
// of a matrix of bad requests → the documented status and error body; the
// queue-full and shutting-down cases; then a fuzz phase of random bytes and
// random JSON (bounded in count and time) after which the server must be
// alive, healthy and no bigger than after a warm-up.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { startServer, assertError, sleep, readSSE, SCALE, tail, WORK, SANITIZED } from './server.mjs';

const KEY = 'sk-hostile';
let s, auth;
before(async () => {
  [s, auth] = await Promise.all([
    startServer(['--max-body-mb', '1', '--max-context', '128', '--parallel', '4', '--max-queue', '64']),
    startServer(['--api-key', KEY]),
  ]);
});
after(async () => { await Promise.all([s?.stop(), auth?.stop()]); });

// One raw HTTP exchange over a socket: writes `data` (string or Buffer,
// possibly in pieces) and reads until the server closes or `ms` pass.
// Returns { status, headers, body, raw, closed, error }.
export function raw(port, data, { ms = 5000, pieces = null, endAfter = true } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    const chunks = [];
    let error = null, finished = false;
    const done = (closed) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      sock.destroy();
      const rawBuf = Buffer.concat(chunks);
      const text = rawBuf.toString('latin1');
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(text);
      const he = text.indexOf('\r\n\r\n');
      const headers = {};
      if (he > 0) for (const l of text.slice(0, he).split('\r\n').slice(1)) { const i = l.indexOf(':'); if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim(); }
      resolve({ status: m ? Number(m[1]) : 0, headers, body: he > 0 ? rawBuf.subarray(he + 4).toString('utf8') : '', raw: text, closed, error });
    };
    const timer = setTimeout(() => done(false), ms);
    sock.on('data', (d) => chunks.push(d));
    sock.on('error', (e) => { error = e.code || e.message; done(true); });
    sock.on('close', () => done(true));
    sock.on('connect', async () => {
      const parts = pieces ?? [data];
      for (const p of parts) {
        if (sock.destroyed) break;
        sock.write(p);
        if (pieces) await sleep(5);
      }
      if (endAfter && !sock.destroyed) sock.end();
    });
  });
}

// A JSON body of an error answer from a raw exchange (chunked bodies
// decoded crudely: the JSON object between the first { and the last }).
function rawJSON(r) {
  const a = r.body.indexOf('{'), b = r.body.lastIndexOf('}');
  try { return JSON.parse(r.body.slice(a, b + 1)); } catch { return null; }
}

const user = (content) => ({ role: 'user', content });
const chat = (over = {}) => ({ model: 'default', messages: [user('hi')], max_tokens: 2, ...over });
const drop = (o, k) => { const c = { ...o }; delete c[k]; return c; };

// [name, path, body (object → JSON, string → as is), status, type, code, param (undefined: not checked)]
const E400 = [400, 'invalid_request_error'];
const rows = [
  ['malformed JSON', '/v1/chat/completions', '{"model": "default", "messages": [', ...E400, 'invalid_json'],
  ['empty body', '/v1/chat/completions', '', ...E400, 'invalid_json'],
  ['JSON with trailing garbage', '/v1/chat/completions', JSON.stringify(chat()) + ' xyz', ...E400, 'invalid_json'],
  ['not UTF-8', '/v1/chat/completions', Buffer.from('{"model": "default", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 'latin1'), ...E400, ['invalid_json', 'invalid_value']],
  ['body is an array', '/v1/chat/completions', [1, 2], ...E400, ['invalid_type', 'invalid_json']],
  ['body is a string', '/v1/chat/completions', '"hello"', ...E400, ['invalid_type', 'invalid_json']],
  ['missing model', '/v1/chat/completions', drop(chat(), 'model'), ...E400, 'missing_field', 'model'],
  ['missing messages', '/v1/chat/completions', drop(chat(), 'messages'), ...E400, 'missing_field', 'messages'],
  ['model of the wrong type', '/v1/chat/completions', chat({ model: 5 }), ...E400, 'invalid_type', 'model'],
  ['messages of the wrong type', '/v1/chat/completions', chat({ messages: 'hi' }), ...E400, 'invalid_type', 'messages'],
  ['messages null', '/v1/chat/completions', chat({ messages: null }), ...E400, ['invalid_type', 'missing_field'], 'messages'],
  ['a message that is not an object', '/v1/chat/completions', chat({ messages: ['hi'] }), ...E400, 'invalid_type', 'messages[0]'],
  ['empty messages', '/v1/chat/completions', chat({ messages: [] }), ...E400, 'invalid_value', 'messages'],
  ['a message without role', '/v1/chat/completions', chat({ messages: [{ content: 'x' }] }), ...E400, 'missing_field', 'messages[0].role'],
  ['role of the wrong type', '/v1/chat/completions', chat({ messages: [{ role: 7, content: 'x' }] }), ...E400, 'invalid_type', 'messages[0].role'],
  ['unknown role', '/v1/chat/completions', chat({ messages: [user('a'), { role: 'wizard', content: 'x' }] }), ...E400, 'invalid_value', 'messages[1].role'],
  ['content of the wrong type', '/v1/chat/completions', chat({ messages: [{ role: 'user', content: 5 }] }), ...E400, 'invalid_type', 'messages[0].content'],
  ['tool message without a call', '/v1/chat/completions', chat({ messages: [user('a'), { role: 'tool', tool_call_id: 'call_9', content: 'x' }] }), ...E400, 'invalid_value'],
  ['tool message without tool_call_id', '/v1/chat/completions',
    chat({ messages: [user('a'), { role: 'assistant', content: '', tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'f', arguments: '{}' } }] }, { role: 'tool', content: 'x' }] }),
    ...E400, 'missing_field', 'messages[2].tool_call_id'],
  ['tool_calls of the wrong type', '/v1/chat/completions', chat({ messages: [user('a'), { role: 'assistant', content: '', tool_calls: 'f()' }] }), ...E400, 'invalid_type', 'messages[1].tool_calls'],
  ['max_tokens of the wrong type', '/v1/chat/completions', chat({ max_tokens: 'ten' }), ...E400, 'invalid_type', 'max_tokens'],
  ['max_tokens 0', '/v1/chat/completions', chat({ max_tokens: 0 }), ...E400, 'invalid_value', 'max_tokens'],
  ['max_tokens negative', '/v1/chat/completions', chat({ max_tokens: -5 }), ...E400, 'invalid_value', 'max_tokens'],
  ['max_tokens fractional', '/v1/chat/completions', chat({ max_tokens: 2.5 }), ...E400, ['invalid_type', 'invalid_value'], 'max_tokens'],
  ['max_completion_tokens of the wrong type', '/v1/chat/completions', chat({ max_completion_tokens: [] }), ...E400, 'invalid_type', 'max_completion_tokens'],
  ['temperature of the wrong type', '/v1/chat/completions', chat({ temperature: 'hot' }), ...E400, 'invalid_type', 'temperature'],
  ['temperature negative', '/v1/chat/completions', chat({ temperature: -1 }), ...E400, 'invalid_value', 'temperature'],
  ['top_p of the wrong type', '/v1/chat/completions', chat({ top_p: 'x' }), ...E400, 'invalid_type', 'top_p'],
  ['top_p over 1', '/v1/chat/completions', chat({ top_p: 1.5 }), ...E400, 'invalid_value', 'top_p'],
  ['top_k of the wrong type', '/v1/chat/completions', chat({ top_k: 'x' }), ...E400, 'invalid_type', 'top_k'],
  ['min_p over 1', '/v1/chat/completions', chat({ min_p: 2 }), ...E400, 'invalid_value', 'min_p'],
  ['seed of the wrong type', '/v1/chat/completions', chat({ seed: 'x' }), ...E400, 'invalid_type', 'seed'],
  ['stream of the wrong type', '/v1/chat/completions', chat({ stream: 'yes' }), ...E400, 'invalid_type', 'stream'],
  ['stop of the wrong type', '/v1/chat/completions', chat({ stop: 5 }), ...E400, 'invalid_type', 'stop'],
  ['stop with 17 strings', '/v1/chat/completions', chat({ stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }), ...E400, 'invalid_value', 'stop'],
  ['logprobs of the wrong type', '/v1/chat/completions', chat({ logprobs: 'x' }), ...E400, 'invalid_type', 'logprobs'],
  ['top_logprobs 21', '/v1/chat/completions', chat({ logprobs: true, top_logprobs: 21 }), ...E400, 'invalid_value', 'top_logprobs'],
  ['n = 2', '/v1/chat/completions', chat({ n: 2 }), ...E400, 'invalid_value', 'n'],
  ['n = 0', '/v1/chat/completions', chat({ n: 0 }), ...E400, 'invalid_value', 'n'],
  ['tools of the wrong type', '/v1/chat/completions', chat({ tools: 'x' }), ...E400, 'invalid_type', 'tools'],
  ['tool_choice unknown', '/v1/chat/completions', chat({ tool_choice: 'sometimes' }), ...E400, 'invalid_value', 'tool_choice'],
  ['response_format of the wrong type', '/v1/chat/completions', chat({ response_format: 'json' }), ...E400, 'invalid_type', 'response_format'],
  ['response_format type unknown', '/v1/chat/completions', chat({ response_format: { type: 'yaml' } }), ...E400, 'invalid_value', 'response_format'],
  ['tool_choice required without tools', '/v1/chat/completions', chat({ tool_choice: 'required' }), ...E400, 'invalid_value', 'tool_choice'],
  ['tool_choice naming no tool', '/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } }), ...E400, 'invalid_value', 'tool_choice'],
  ['thinking of the wrong type', '/v1/chat/completions', chat({ thinking: 'yes' }), ...E400, 'invalid_type'],
  ['thinking type unknown', '/v1/chat/completions', chat({ thinking: { type: 'maybe' } }), ...E400, 'invalid_value'],
  ['reasoning_effort unknown', '/v1/chat/completions', chat({ reasoning_effort: 'extreme' }), ...E400, 'invalid_value', 'reasoning_effort'],
  ['presence_penalty over 2', '/v1/chat/completions', chat({ presence_penalty: 2.5 }), ...E400, 'invalid_value', 'presence_penalty'],
  ['frequency_penalty under -2', '/v1/chat/completions', chat({ frequency_penalty: -3 }), ...E400, 'invalid_value', 'frequency_penalty'],
  ['logit_bias of the wrong type', '/v1/chat/completions', chat({ logit_bias: [1] }), ...E400, 'invalid_type', 'logit_bias'],
  ['logit_bias key not a token id', '/v1/chat/completions', chat({ logit_bias: { hello: 1 } }), ...E400, 'invalid_value', 'logit_bias'],
  ['logit_bias token out of the vocabulary', '/v1/chat/completions', chat({ logit_bias: { 999999999: 1 } }), ...E400, 'invalid_value', 'logit_bias'],
  ['logit_bias over 100', '/v1/chat/completions', chat({ logit_bias: { 5: 150 } }), ...E400, 'invalid_value', 'logit_bias'],
  ['stream_options of the wrong type', '/v1/chat/completions', chat({ stream: true, stream_options: 3 }), ...E400, 'invalid_type', 'stream_options'],
  ['prompt over the context limit', '/v1/chat/completions', chat({ messages: [user('word '.repeat(400))] }), ...E400, 'context_length_exceeded'],
  ['unknown model', '/v1/chat/completions', chat({ model: 'gpt-4' }), 404, 'invalid_request_error', 'model_not_found', 'model'],
  // Completions.
  ['completions: missing prompt', '/v1/completions', { model: 'default', max_tokens: 2 }, ...E400, 'missing_field', 'prompt'],
  ['completions: prompt of the wrong type', '/v1/completions', { model: 'default', prompt: 5, max_tokens: 2 }, ...E400, 'invalid_type', 'prompt'],
  ['completions: two prompts', '/v1/completions', { model: 'default', prompt: ['a', 'b'], max_tokens: 2 }, ...E400, 'invalid_value', 'prompt'],
  ['completions: empty prompt array', '/v1/completions', { model: 'default', prompt: [], max_tokens: 2 }, ...E400, 'invalid_value', 'prompt'],
  ['completions: token id out of the vocabulary', '/v1/completions', { model: 'default', prompt: [0, 999999999], max_tokens: 2 }, ...E400, 'invalid_value', 'prompt'],
  ['completions: negative token id', '/v1/completions', { model: 'default', prompt: [0, -3], max_tokens: 2 }, ...E400, 'invalid_value', 'prompt'],
  ['completions: mixed prompt array', '/v1/completions', { model: 'default', prompt: [0, 'a'], max_tokens: 2 }, ...E400, ['invalid_type', 'invalid_value'], 'prompt'],
  ['completions: echo', '/v1/completions', { model: 'default', prompt: 'a', echo: true, max_tokens: 2 }, ...E400, 'invalid_value', 'echo'],
  ['completions: suffix', '/v1/completions', { model: 'default', prompt: 'a', suffix: 'b', max_tokens: 2 }, ...E400, 'invalid_value', 'suffix'],
  ['completions: logprobs 21', '/v1/completions', { model: 'default', prompt: 'a', logprobs: 21, max_tokens: 2 }, ...E400, 'invalid_value', 'logprobs'],
  ['completions: prompt over the context limit', '/v1/completions', { model: 'default', prompt: Array(200).fill(5), max_tokens: 2 }, ...E400, 'context_length_exceeded'],
  ['completions: unknown model', '/v1/completions', { model: 'x', prompt: 'a' }, 404, 'invalid_request_error', 'model_not_found', 'model'],
  // Tokenizer endpoints.
  ['tokenize: missing content', '/tokenize', {}, ...E400, 'missing_field', 'content'],
  ['tokenize: content of the wrong type', '/tokenize', { content: 5 }, ...E400, 'invalid_type', 'content'],
  ['tokenize: not JSON', '/tokenize', 'content=hi', ...E400, 'invalid_json'],
  ['detokenize: tokens of the wrong type', '/detokenize', { tokens: 'x' }, ...E400, 'invalid_type', 'tokens'],
  ['detokenize: token id out of the vocabulary', '/detokenize', { tokens: [1, 999999999] }, ...E400, 'invalid_value', 'tokens'],
  ['detokenize: missing tokens', '/detokenize', {}, ...E400, 'missing_field', 'tokens'],
];

for (const [name, path, body, status, type, code, param] of rows) {
  test(`bad input: ${name} → ${status} ${Array.isArray(code) ? code.join('|') : code}`, async () => {
    const r = await s.json(path, Array.isArray(body) || (typeof body === 'object' && !(body instanceof Buffer)) ? JSON.stringify(body) : body);
    const codes = Array.isArray(code) ? code : [code];
    assertError(r, status, type, r.body?.error?.code && codes.includes(r.body.error.code) ? r.body.error.code : codes[0], name);
    if (param !== undefined) assert.equal(r.body.error.param, param, `${name}: error.param`);
    if (code === 'context_length_exceeded') {
      assert.match(r.body.error.message, /^This model's maximum context length is 128 tokens; the prompt has \d+ tokens\.$/);
    }
  });
}

// Status/code rows that need raw HTTP or other servers.
test('unknown path → 404 not_found (GET and POST)', async () => {
  for (const [method, p] of [['GET', '/v2/nothing'], ['POST', '/v1/nothing'], ['GET', '/v1/chat'], ['GET', '/../../etc/passwd']]) {
    const r = await fetch(s.url + p, { method, body: method === 'POST' ? '{}' : undefined });
    const text = await r.text();
    let j = null; try { j = JSON.parse(text); } catch { /* checked below */ }
    assertError({ status: r.status, body: j, text }, 404, 'invalid_request_error', 'not_found', `${method} ${p}`);
  }
});

test('wrong method → 405 method_not_allowed', async () => {
  for (const [method, p] of [['GET', '/v1/chat/completions'], ['GET', '/v1/completions'], ['POST', '/health'], ['DELETE', '/v1/models'], ['PUT', '/tokenize'], ['POST', '/metrics']]) {
    const r = await fetch(s.url + p, { method, body: method === 'GET' ? undefined : '{}' });
    const text = await r.text();
    let j = null; try { j = JSON.parse(text); } catch { /* checked below */ }
    assertError({ status: r.status, body: j, text }, 405, 'invalid_request_error', 'method_not_allowed', `${method} ${p}`);
  }
});

test('body over --max-body-mb → 413 request_too_large', async () => {
  // curl reads the answer while it sends (the server answers before it has
  // read the body, and closes).
  const big = path.join(WORK, `big-body-${process.pid}.json`);
  fs.writeFileSync(big, JSON.stringify(chat({ messages: [user('x'.repeat(2 << 20))] })));
  const out = await new Promise((resolve, reject) => execFile('curl', ['-sS', '--max-time', '60', '-H', 'Content-Type: application/json',
    '--data-binary', `@${big}`, '-w', '\n%{http_code}', `${s.url}/v1/chat/completions`], (e, stdout, stderr) => (e ? reject(new Error(`curl: ${e.message} ${stderr}`)) : resolve(stdout))));
  fs.rmSync(big, { force: true });
  const i = out.lastIndexOf('\n');
  const status = Number(out.slice(i + 1)), text = out.slice(0, i);
  let j = null; try { j = JSON.parse(text); } catch { /* checked below */ }
  assertError({ status, body: j, text }, 413, 'invalid_request_error', 'request_too_large', '2 MiB body');
  // Just under the limit is not refused for its size.
  const ok = await s.json('/v1/chat/completions', chat({ messages: [user('x'.repeat(900 << 10))] }));
  assert.notEqual(ok.status, 413, 'a 0.9 MiB body is under --max-body-mb 1');
});

test('missing or wrong API key → 401 invalid_api_key; /health and / need none', async () => {
  const body = JSON.stringify(chat());
  for (const h of [{}, { authorization: 'Bearer wrong' }, { authorization: `Bearer ${KEY}x` }, { authorization: 'Bearer' },
                   { authorization: `Basic ${Buffer.from(`u:${KEY}`).toString('base64')}` }, { authorization: KEY }]) {
    for (const [m, p] of [['POST', '/v1/chat/completions'], ['GET', '/v1/models'], ['GET', '/metrics'], ['POST', '/tokenize']]) {
      const r = await fetch(auth.url + p, { method: m, headers: { 'content-type': 'application/json', ...h }, body: m === 'POST' ? body : undefined });
      const text = await r.text();
      let j = null; try { j = JSON.parse(text); } catch { /* checked below */ }
      assertError({ status: r.status, body: j, text }, 401, 'invalid_request_error', 'invalid_api_key', `${m} ${p} with ${JSON.stringify(h)}`);
    }
  }
  assert.equal((await fetch(auth.url + '/health')).status, 200);
  assert.equal((await fetch(auth.url + '/')).status, 200);
  const ok = await auth.json('/v1/chat/completions', chat(), { authorization: `Bearer ${KEY}` });
  assert.equal(ok.status, 200, ok.text);
});

test('queue full → 429 rate_limit_error queue_full with Retry-After: 1', async () => {
  const q = await startServer(['--parallel', '1', '--max-queue', '1']);
  try {
    const slow = chat({ messages: [user('Write a long story.')], max_tokens: 400, ignore_eos: true, temperature: 0 });
    const results = await Promise.all(Array.from({ length: 6 }, async () => {
      const r = await q.post('/v1/chat/completions', slow);
      return { status: r.status, retry: r.headers.get('retry-after'), text: await r.text() };
    }));
    const counts = {};
    for (const r of results) counts[r.status] = (counts[r.status] ?? 0) + 1;
    assert.ok((counts[429] ?? 0) >= 1, `some 429: ${JSON.stringify(counts)}`);
    assert.ok((counts[200] ?? 0) >= 1, `the admitted ones finish: ${JSON.stringify(counts)}`);
    assert.equal((counts[200] ?? 0) + (counts[429] ?? 0), 6, `only 200 and 429: ${JSON.stringify(counts)}`);
    for (const r of results.filter((x) => x.status === 429)) {
      assert.equal(r.retry, '1', 'Retry-After: 1');
      assertError({ status: 429, body: JSON.parse(r.text), text: r.text }, 429, 'rate_limit_error', 'queue_full', '429');
    }
    const m = await q.metrics();
    assert.equal(m.dsv4_requests_rejected_total, counts[429], 'dsv4_requests_rejected_total counts the 429s');
  } finally {
    await q.stop();
  }
});

test('shutting down: a running stream ends with [DONE], new requests get 503 or a refused connection, exit 0', async () => {
  const d = await startServer(['--shutdown-timeout', '3']);
  let stopped;
  try {
    const res = await d.post('/v1/chat/completions', chat({ messages: [user('Write a long story.')], max_tokens: 60000, ignore_eos: true, stream: true }));
    assert.equal(res.status, 200);
    let sawChunk;
    const firstChunk = new Promise((r) => { sawChunk = r; });
    const reading = readSSE(res, { onEvent: () => sawChunk() });
    await firstChunk;
    d.proc.kill('SIGTERM');
    await sleep(300);
    // A new request while it shuts down: 503 shutting_down, or no connection.
    try {
      const r = await d.json('/v1/chat/completions', chat());
      assertError(r, 503, 'server_error', 'shutting_down', 'a request after SIGTERM');
    } catch (e) {
      if (e instanceof assert.AssertionError) throw e;  // else: connection refused/reset is allowed
    }
    const { events } = await reading;
    assert.equal(events.at(-1), '[DONE]', 'the cut stream still ends with [DONE]');
    const last = events.at(-2);
    assert.ok(last.error || last.choices?.[0]?.finish_reason || (last.choices?.length === 0 && last.usage),
              `the last event before [DONE] ends the answer: ${JSON.stringify(last)}`);
    stopped = d.stop({ deadlineMs: 15000, signal: null });  // no second signal; it must exit 0 on its own
    await stopped;
  } finally {
    if (!stopped) d.kill();
  }
});

test('after the matrix the server still answers a normal request', async () => {
  const r = await s.json('/v1/chat/completions', chat({ max_tokens: 4 }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.choices[0].message.role, 'assistant');
  assert.ok(s.alive());
});

// ---- Fuzz -------------------------------------------------------------------
let seed = 12345;
const rnd = () => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; };
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];

function randomValue(depth = 0) {
  switch (ri(depth > 2 ? 6 : 8)) {
    case 0: return null;
    case 1: return rnd() < 0.5;
    case 2: return pick([0, -1, 1, 2, 0.5, 1e308, -1e308, 2 ** 31, 2 ** 53, 3.7, -0]);
    case 3: return pick(['', 'a', 'default', 'user', 'assistant', 'tool', '\u0000', '💥', 'x'.repeat(ri(300)), '<｜User｜>', '{"a":']);
    case 4: return String.fromCharCode(...Array.from({ length: ri(20) }, () => ri(0xd800)));
    case 5: return ri(1000) - 100;
    case 6: return Array.from({ length: ri(4) }, () => randomValue(depth + 1));
    default: { const o = {}; for (let i = ri(4); i > 0; i--) o[pick(['role', 'content', 'type', 'name', 'x', 'tool_calls', 'function'])] = randomValue(depth + 1); return o; }
  }
}

const FIELDS_CHAT = ['model', 'messages', 'tools', 'tool_choice', 'thinking', 'reasoning_effort', 'max_tokens', 'max_completion_tokens', 'temperature',
  'top_p', 'top_k', 'min_p', 'seed', 'stop', 'stream', 'stream_options', 'logprobs', 'top_logprobs', 'n', 'ignore_eos', 'return_token_ids', 'presence_penalty', 'frequency_penalty', 'logit_bias', 'response_format'];
const FIELDS_CMPL = ['model', 'prompt', 'max_tokens', 'temperature', 'top_p', 'seed', 'stop', 'stream', 'logprobs', 'echo', 'suffix', 'ignore_eos', 'return_token_ids',
  'presence_penalty', 'logit_bias'];

// A random request: a valid one with a few fields replaced, dropped or
// added. Generation stays short: max_tokens is never dropped and is
// replaced only by small or invalid values.
function randomRequest() {
  const kind = ri(4);
  let path, body;
  if (kind <= 1) {
    path = '/v1/chat/completions';
    body = { model: 'default', messages: [{ role: pick(['user', 'system']), content: pick(['hi', 'tell me', '']) }], max_tokens: 1 + ri(3) };
    if (rnd() < 0.3) body.messages.push({ role: 'assistant', content: 'ok', tool_calls: rnd() < 0.5 ? [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{}' } }] : undefined });
    if (rnd() < 0.3) body.messages.push({ role: pick(['user', 'tool', 'developer', 'latest_reminder']), content: 'x', tool_call_id: 'c' });
    for (let i = ri(4); i > 0; i--) {
      const f = pick(FIELDS_CHAT);
      if (f === 'max_tokens' || f === 'max_completion_tokens') body[f] = pick([0, -1, 1, 2, 3, 'x', null, [], 2.5]);
      else if (rnd() < 0.15 && f !== 'model') delete body[f];
      else body[f] = f === 'messages' && rnd() < 0.5 ? [randomValue(1)] : randomValue();
    }
    if (body.max_completion_tokens === null || typeof body.max_completion_tokens !== 'number') delete body.max_completion_tokens;
  } else if (kind === 2) {
    path = '/v1/completions';
    body = { model: 'default', prompt: pick(['hello', [0, 5, 6], [[0, 1]], '']), max_tokens: 1 + ri(3) };
    for (let i = ri(4); i > 0; i--) {
      const f = pick(FIELDS_CMPL);
      body[f] = f === 'max_tokens' ? pick([0, -1, 1, 2, 'x', null, 2.5]) : randomValue();
    }
  } else {
    path = pick(['/tokenize', '/detokenize']);
    body = path === '/tokenize' ? { content: randomValue(), add_special: randomValue() } : { tokens: rnd() < 0.5 ? Array.from({ length: ri(10) }, () => ri(140000) - 100) : randomValue() };
  }
  let text = JSON.stringify(body);
  if (rnd() < 0.1) text = text.slice(0, ri(text.length));  // cut
  return { path, text };
}

function randomBytes() {
  const r = ri(5);
  if (r === 0) return Buffer.from(Array.from({ length: 1 + ri(600) }, () => ri(256)));
  const method = pick(['GET', 'POST', 'PUT', 'DELETE', 'OPTIONS', 'HEAD', 'PATCH', 'BREW', 'G\u00e9T', '']);
  const p = pick(['/', '/health', '/v1/models', '/v1/chat/completions', '/v1/completions', '/metrics', '/tokenize', '/detokenize', '/%00', '/' + 'a'.repeat(ri(9000)), '*', 'http://x/']);
  const ver = pick(['HTTP/1.1', 'HTTP/1.0', 'HTTP/2.0', 'HTTP/9', '']);
  let head = `${method} ${p} ${ver}\r\nHost: 127.0.0.1\r\n`;
  const body = r === 1 ? '{"model":"default","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' : randomValue() + '';
  switch (ri(7)) {
    case 0: head += `Content-Length: ${body.length}\r\n`; break;
    case 1: head += `Content-Length: ${pick([-1, 99999999999, 'abc', body.length + 50])}\r\n`; break;
    case 2: head += 'Transfer-Encoding: chunked\r\n'; break;
    case 3: head += `X-${'h'.repeat(ri(100))}: ${'v'.repeat(ri(10000))}\r\n`; break;
    case 4: for (let i = 0; i < 200; i++) head += `X-${i}: ${i}\r\n`; break;
    case 5: head += 'Content-Length: 5\r\nContent-Length: 7\r\n'; break;
    default: break;
  }
  if (rnd() < 0.5) head += 'Connection: close\r\n';
  const body2 = head.includes('chunked') ? pick([`${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`, `zz\r\n${body}`, 'ffffffff\r\nab']) : body;
  let data = head + (rnd() < 0.8 ? '\r\n' : '') + body2;
  if (rnd() < 0.2) data = data.slice(0, ri(data.length));
  return Buffer.from(data, 'utf8');
}

const OK_STATUS = new Set([200, 400, 404, 405, 413, 429, 431, 414, 501, 505]);

async function fuzzOne(i, stats) {
  if (i % 2 === 0) {
    const data = randomBytes();
    const r = await raw(s.port, data, { ms: 1500, pieces: rnd() < 0.1 ? [data.subarray(0, data.length >> 1), data.subarray(data.length >> 1)] : null });
    stats.raw++;
    if (r.status) {
      stats.rawAnswered++;
      assert.ok(r.status < 500 || r.status === 501 || r.status === 505 || r.status === 503,
                `raw request answered ${r.status}: ${JSON.stringify(data.toString('latin1').slice(0, 300))} → ${tail(r.raw, 300)}`);
    }
  } else {
    const { path, text } = randomRequest();
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), 30000);
    try {
      const r = await fetch(s.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: text, signal: ctl.signal });
      const body = await r.text();
      stats.json++;
      stats.status[r.status] = (stats.status[r.status] ?? 0) + 1;
      assert.ok(OK_STATUS.has(r.status), `${path} ${text.slice(0, 400)} → ${r.status} ${body.slice(0, 400)}`);
      if (r.status >= 400) {
        let j = null; try { j = JSON.parse(body); } catch { /* below */ }
        assert.ok(j?.error && typeof j.error.type === 'string' && typeof j.error.code === 'string' && typeof j.error.message === 'string',
                  `${path} ${text.slice(0, 300)} → ${r.status} without the error shape: ${body.slice(0, 300)}`);
      } else if ((r.headers.get('content-type') ?? '').includes('text/event-stream')) {
        assert.ok(body.trimEnd().endsWith('data: [DONE]'), `a stream without [DONE]: ${tail(body, 300)}`);
      } else {
        JSON.parse(body);
      }
    } finally {
      clearTimeout(timer);
    }
  }
}

async function fuzzPhase(total, seconds, concurrency, stats) {
  const end = Date.now() + seconds * 1000;
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < total && Date.now() < end) await fuzzOne(next++, stats);
  }));
  return next;
}

async function settled(srv) {
  for (let i = 0; i < 200; i++) {
    const m = await srv.metrics();
    if (m.dsv4_requests_running === 0 && m.dsv4_requests_queued === 0) return m;
    await sleep(100);
  }
  assert.fail('requests still running 20 s after the fuzz');
}

test('fuzz: random bytes and random JSON; no crash, no leak', { timeout: 300e3 }, async () => {
  const TOTAL = Math.max(200, Math.round(10000 * SCALE));
  const SECONDS = 120;  // a bound, not the aim: 10,000 take about a minute in Release
  const warm = { raw: 0, rawAnswered: 0, json: 0, status: {} };
  await fuzzPhase(Math.max(100, Math.round(500 * SCALE)), 30, 8, warm);
  const before = await settled(s);
  const stats = { raw: 0, rawAnswered: 0, json: 0, status: {} };
  const t0 = Date.now();
  const n = await fuzzPhase(TOTAL, SECONDS, 16, stats);
  const secs = (Date.now() - t0) / 1000;
  console.log(`fuzz: ${n} requests in ${secs.toFixed(1)} s (${stats.raw} raw, ${stats.rawAnswered} of them answered; ${stats.json} JSON: ${JSON.stringify(stats.status)}) after a warm-up of ${warm.raw + warm.json}`);
  assert.ok(s.alive(), `the server died: ${JSON.stringify(s.exited())}\n${tail(s.log())}`);
  const h = await fetch(s.url + '/health');
  assert.equal(h.status, 200);
  const m = await settled(s);
  assert.equal(m.dsv4_cache_pool_bytes_used, 0, 'the cache pool is empty again');
  const grow = m.dsv4_resident_memory_bytes - before.dsv4_resident_memory_bytes;
  const prefixGrow = Math.max(0, m.dsv4_prefix_cache_bytes - before.dsv4_prefix_cache_bytes);
  console.log(`fuzz: RSS ${(before.dsv4_resident_memory_bytes / 2 ** 20).toFixed(1)} → ${(m.dsv4_resident_memory_bytes / 2 ** 20).toFixed(1)} MiB (prefix cache +${(prefixGrow / 2 ** 20).toFixed(1)} MiB)`);
  if (!SANITIZED) assert.ok(grow <= prefixGrow + (64 << 20), `RSS grew by ${(grow / 2 ** 20).toFixed(1)} MiB over the fuzz`);
  assert.ok(n >= Math.min(TOTAL, 1000 * SCALE), `only ${n} fuzz requests in ${SECONDS} s`);
  const r = await s.json('/v1/chat/completions', chat({ max_tokens: 2 }));
  assert.equal(r.status, 200, r.text);
});
