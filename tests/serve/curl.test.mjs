// dsv4 serve through curl (docs/SERVER.md): chat (plain and streamed with
// `curl -N`), completions (text and token-id prompts), /v1/models, /health,
// /tokenize + /detokenize, /metrics, CORS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { startServer, METRICS, parseMetrics, metricTypes } from './server.mjs';

let s;
before(async () => { s = await startServer(); });
after(async () => { if (s) await s.stop(); });

// Runs curl; returns { status, headers (lower-case names), body (text) }.
function curl(args) {
  return new Promise((resolve, reject) => {
    execFile('curl', ['-sS', '--max-time', '120', '-D', '-', ...args], { maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err) return reject(new Error(`curl ${args.join(' ')}: ${err.message} ${stderr}`));
      // -D - puts the header block(s) first; a 100 Continue block may precede.
      let rest = stdout.replace(/\r\n/g, '\n');
      let status = 0, headers = {};
      while (/^HTTP\/[\d.]+ \d+/.test(rest)) {
        const end = rest.indexOf('\n\n');
        const block = end >= 0 ? rest.slice(0, end) : rest;
        rest = end >= 0 ? rest.slice(end + 2) : '';
        const lines = block.split('\n');
        status = Number(lines[0].split(' ')[1]);
        headers = {};
        for (const l of lines.slice(1)) { const i = l.indexOf(':'); if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim(); }
        if (status !== 100) break;
      }
      resolve({ status, headers, body: rest });
    });
  });
}
const post = (path, body, extra = []) =>
  curl(['-X', 'POST', `${s.url}${path}`, '-H', 'Content-Type: application/json', '-d', JSON.stringify(body), ...extra]);
const postJSON = async (path, body) => {
  const r = await post(path, body);
  let j;
  try { j = JSON.parse(r.body); } catch { assert.fail(`${path}: not JSON (${r.status}): ${r.body}`); }
  return { ...r, json: j };
};

// Parses an SSE body as curl -N printed it.
function sse(text) {
  const events = [], comments = [];
  for (const block of text.split('\n\n')) {
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) comments.push(line);
      else if (line.startsWith('data:')) {
        const d = line.slice(5).trim();
        events.push(d === '[DONE]' ? d : JSON.parse(d));
      }
    }
  }
  return { events, comments };
}

const isInt = (x) => Number.isInteger(x);
function checkUsage(u, maxTokens) {
  assert.ok(u && isInt(u.prompt_tokens) && u.prompt_tokens > 0, `usage.prompt_tokens: ${JSON.stringify(u)}`);
  assert.ok(isInt(u.completion_tokens) && u.completion_tokens >= 1, 'usage.completion_tokens');
  if (maxTokens) assert.ok(u.completion_tokens <= maxTokens, `completion_tokens ${u.completion_tokens} > max_tokens ${maxTokens}`);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens, 'usage.total_tokens');
  const k = u.prompt_tokens_details?.cached_tokens;
  assert.ok(isInt(k) && k >= 0 && k <= u.prompt_tokens, `usage.prompt_tokens_details.cached_tokens: ${JSON.stringify(u)}`);
}

const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name three colours.' }];

test('GET /health is 200 {"status":"ok"}', async () => {
  const r = await curl([`${s.url}/health`]);
  assert.equal(r.status, 200);
  assert.deepEqual(JSON.parse(r.body), { status: 'ok' });
});

test('GET /v1/models lists the served model', async () => {
  const r = await curl([`${s.url}/v1/models`]);
  assert.equal(r.status, 200);
  assert.match(r.headers['content-type'] ?? '', /application\/json/);
  const j = JSON.parse(r.body);
  assert.equal(j.object, 'list');
  assert.equal(j.data.length, 1);
  const m = j.data[0];
  assert.equal(m.id, 'default', 'the model directory\'s last component');
  assert.equal(m.object, 'model');
  assert.equal(m.owned_by, 'dsv4');
  assert.ok(isInt(m.created) && m.created > 1.6e9 && m.created < Date.now() / 1000 + 60, `created ${m.created}`);
  assert.ok(isInt(m.max_model_len) && m.max_model_len > 0, `max_model_len ${m.max_model_len}`);
});

test('GET /v1/models/{id}: the served model, or 404 model_not_found', async () => {
  const list = JSON.parse((await curl([`${s.url}/v1/models`])).body);
  const r = await curl([`${s.url}/v1/models/default`]);
  assert.equal(r.status, 200);
  assert.deepEqual(JSON.parse(r.body), list.data[0]);
  const missing = await curl([`${s.url}/v1/models/gpt-4`]);
  assert.equal(missing.status, 404);
  assert.equal(JSON.parse(missing.body).error.code, 'model_not_found');
  assert.equal((await curl(['-X', 'POST', `${s.url}/v1/models/default`])).status, 405);
});

test('CORS: without --cors-origin a preflight is a 405 and no answer carries Access-Control headers', async () => {
  const origin = ['-H', 'Origin: http://app.example:3000'];
  const pre = await curl(['-X', 'OPTIONS', `${s.url}/v1/chat/completions`, ...origin, '-H', 'Access-Control-Request-Method: POST']);
  assert.equal(pre.status, 405);
  assert.equal(pre.headers['access-control-allow-origin'], undefined);
  const r = await curl([`${s.url}/v1/models`, ...origin]);
  assert.equal(r.status, 200);
  assert.equal(r.headers['access-control-allow-origin'], undefined);
});

test('CORS: --cors-origin answers preflights (no key needed) and marks answers, errors too, for that origin only', async () => {
  const app = 'http://app.example:3000';
  const c = await startServer(['--cors-origin', app, '--api-key', 'k']);
  try {
    const pre = await curl(['-X', 'OPTIONS', `${c.url}/v1/chat/completions`, '-H', `Origin: ${app}`,
      '-H', 'Access-Control-Request-Method: POST', '-H', 'Access-Control-Request-Headers: authorization, content-type']);
    assert.equal(pre.status, 204);
    assert.equal(pre.headers['access-control-allow-origin'], app);
    assert.match(pre.headers['access-control-allow-methods'] ?? '', /POST/);
    assert.match(pre.headers['access-control-allow-headers'] ?? '', /Authorization/i);
    const ok = await curl([`${c.url}/v1/models`, '-H', `Origin: ${app}`, '-H', 'Authorization: Bearer k']);
    assert.equal(ok.status, 200);
    assert.equal(ok.headers['access-control-allow-origin'], app);
    const denied = await curl([`${c.url}/v1/models`, '-H', `Origin: ${app}`]);
    assert.equal(denied.status, 401);
    assert.equal(denied.headers['access-control-allow-origin'], app);
    const other = await curl(['-X', 'OPTIONS', `${c.url}/v1/models`, '-H', 'Origin: http://other.example', '-H', 'Access-Control-Request-Method: GET']);
    assert.equal(other.status, 405);
    assert.equal(other.headers['access-control-allow-origin'], undefined);
  } finally {
    await c.stop();
  }
});

let plainChat;
test('chat completion (not streamed): the documented shape', async () => {
  const r = await postJSON('/v1/chat/completions', { model: 'default', messages, max_tokens: 12, temperature: 0 });
  assert.equal(r.status, 200, r.body);
  assert.match(r.headers['content-type'] ?? '', /application\/json/);
  const j = r.json;
  assert.match(j.id, /^chatcmpl-/);
  assert.equal(j.object, 'chat.completion');
  assert.ok(isInt(j.created) && Math.abs(j.created - Date.now() / 1000) < 600, `created ${j.created}`);
  assert.equal(j.model, 'default');
  assert.match(j.system_fingerprint, /^dsv4-/);
  assert.equal(j.choices.length, 1);
  const c = j.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(!('reasoning_content' in c.message), 'reasoning_content only in thinking mode');
  assert.ok(c.logprobs === null || c.logprobs === undefined, 'logprobs null without logprobs');
  assert.ok(['stop', 'length'].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
  checkUsage(j.usage, 12);
  if (c.finish_reason === 'length') assert.equal(j.usage.completion_tokens, 12);
  plainChat = j;
});

test('chat completion streamed (curl -N): SSE chunks, [DONE] last, include_usage, same text as unstreamed', async () => {
  assert.ok(plainChat, 'needs the unstreamed answer');
  const r = await post('/v1/chat/completions',
    { model: 'default', messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true } }, ['-N']);
  assert.equal(r.status, 200, r.body);
  assert.match(r.headers['content-type'] ?? '', /text\/event-stream/);
  const { events } = sse(r.body);
  assert.equal(events.at(-1), '[DONE]', 'the stream ends with data: [DONE]');
  assert.equal(events.filter((e) => e === '[DONE]').length, 1);
  const chunks = events.slice(0, -1);
  assert.ok(chunks.length >= 3, `chunks: ${chunks.length}`);
  for (const c of chunks) {
    assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(c.id, chunks[0].id, 'one id for the whole stream');
    assert.match(c.id, /^chatcmpl-/);
    assert.equal(c.model, 'default');
  }
  assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' }, 'the first delta');
  const usageChunk = chunks.at(-1);
  assert.deepEqual(usageChunk.choices, [], 'the usage chunk has no choices');
  checkUsage(usageChunk.usage, 12);
  assert.deepEqual(usageChunk.usage.completion_tokens, plainChat.usage.completion_tokens);
  assert.deepEqual(usageChunk.usage.prompt_tokens, plainChat.usage.prompt_tokens);
  const last = chunks.at(-2);
  assert.equal(last.choices.length, 1);
  assert.equal(last.choices[0].finish_reason, plainChat.choices[0].finish_reason);
  assert.deepEqual(last.choices[0].delta, {}, 'the last choice chunk has an empty delta');
  let content = '';
  for (const c of chunks.slice(1, -2)) {
    assert.equal(c.choices.length, 1);
    assert.ok(c.choices[0].finish_reason == null, 'finish_reason only on the last chunk');
    assert.ok(!('role' in c.choices[0].delta) || c === chunks[0]);
    assert.ok(!('reasoning_content' in c.choices[0].delta), 'no reasoning without thinking');
    if (c.choices[0].delta.content !== undefined) content += c.choices[0].delta.content;
  }
  assert.equal(content, plainChat.choices[0].message.content, 'streamed text = unstreamed text at temperature 0');
});

test('chat stream without include_usage has no usage chunk', async () => {
  const r = await post('/v1/chat/completions', { model: 'default', messages, max_tokens: 4, temperature: 0, stream: true }, ['-N']);
  assert.equal(r.status, 200, r.body);
  const { events } = sse(r.body);
  assert.equal(events.at(-1), '[DONE]');
  for (const e of events.slice(0, -1)) assert.equal(e.choices.length, 1, `a chunk without a choice: ${JSON.stringify(e)}`);
  assert.ok(events.at(-2).choices[0].finish_reason, 'the last chunk carries finish_reason');
});

let promptTokens;
test('POST /tokenize and /detokenize round trip', async () => {
  const content = 'Hello, world! Ünïcödé 你好 🙂';
  const a = await postJSON('/tokenize', { content, add_special: true });
  assert.equal(a.status, 200, a.body);
  const b = await postJSON('/tokenize', { content, add_special: false });
  assert.equal(b.status, 200, b.body);
  assert.ok(Array.isArray(a.json.tokens) && a.json.tokens.every(isInt));
  assert.equal(a.json.tokens.length, b.json.tokens.length + 1, 'add_special puts the BOS first');
  assert.deepEqual(a.json.tokens.slice(1), b.json.tokens);
  const d = await postJSON('/detokenize', { tokens: b.json.tokens });
  assert.equal(d.status, 200, d.body);
  assert.equal(d.json.content, content);
  promptTokens = a.json.tokens;
});

test('completions: text prompt, token-id prompt and [token-id prompt] give the same answer at temperature 0', async () => {
  const prompt = 'Hello, world! Ünïcödé 你好 🙂';
  const t = await postJSON('/v1/completions', { model: 'default', prompt, max_tokens: 10, temperature: 0 });
  assert.equal(t.status, 200, t.body);
  const j = t.json;
  assert.match(j.id, /^cmpl-/);
  assert.equal(j.object, 'text_completion');
  assert.equal(j.model, 'default');
  assert.equal(j.choices.length, 1);
  assert.equal(j.choices[0].index, 0);
  assert.equal(typeof j.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(j.choices[0].finish_reason));
  assert.ok(j.choices[0].logprobs == null);
  checkUsage(j.usage, 10);
  if (promptTokens) assert.equal(j.usage.prompt_tokens, promptTokens.length, 'a string prompt is tokenized with the BOS first');
  const tok = await postJSON('/tokenize', { content: prompt, add_special: true });
  for (const p of [tok.json.tokens, [tok.json.tokens]]) {
    const r = await postJSON('/v1/completions', { model: 'default', prompt: p, max_tokens: 10, temperature: 0 });
    assert.equal(r.status, 200, r.body);
    assert.equal(r.json.choices[0].text, j.choices[0].text);
    assert.equal(r.json.usage.prompt_tokens, tok.json.tokens.length);
    assert.equal(r.json.usage.completion_tokens, j.usage.completion_tokens);
  }
});

test('completions: max_tokens defaults to 16; streamed completions end with [DONE]', async () => {
  const r = await postJSON('/v1/completions', { model: 'default', prompt: 'Once upon a time', temperature: 0, ignore_eos: true });
  assert.equal(r.status, 200, r.body);
  assert.equal(r.json.usage.completion_tokens, 16);
  assert.equal(r.json.choices[0].finish_reason, 'length');
  const st = await post('/v1/completions', { model: 'default', prompt: 'Once upon a time', temperature: 0, ignore_eos: true, stream: true }, ['-N']);
  assert.equal(st.status, 200, st.body);
  const { events } = sse(st.body);
  assert.equal(events.at(-1), '[DONE]');
  let text = '';
  for (const e of events.slice(0, -1)) {
    assert.equal(e.object, 'text_completion');
    text += e.choices[0]?.text ?? '';
  }
  assert.equal(events.at(-2).choices[0].finish_reason, 'length');
  assert.equal(text, r.json.choices[0].text);
});

test('GET /metrics: Prometheus text with every documented metric', async () => {
  // The last answer is out, but its request may still take a step (the
  // prefix cache keeps the state after the answer): wait for it to leave.
  let r;
  for (let i = 0; i < 50; i++) {
    r = await curl([`${s.url}/metrics`]);
    if (/^dsv4_requests_running 0$/m.test(r.body)) break;
    await new Promise((f) => setTimeout(f, 100));
  }
  assert.equal(r.status, 200);
  assert.match(r.headers['content-type'] ?? '', /^text\/plain/);
  const m = parseMetrics(r.body);
  const types = metricTypes(m);
  for (const [name, kind] of Object.entries(METRICS)) {
    assert.ok(name in m, `${name} missing from /metrics:\n${r.body}`);
    assert.ok(Number.isFinite(m[name]) && m[name] >= 0, `${name} = ${m[name]}`);
    assert.equal(types[name], kind, `# TYPE ${name}`);
  }
  // What the tests above did shows.
  assert.ok(m.dsv4_requests_total >= 7, `dsv4_requests_total ${m.dsv4_requests_total}`);
  assert.ok(m.dsv4_generated_tokens_total >= 40, `dsv4_generated_tokens_total ${m.dsv4_generated_tokens_total}`);
  assert.ok(m.dsv4_prompt_tokens_total > 0);
  assert.equal(m.dsv4_requests_running, 0);
  assert.equal(m.dsv4_requests_queued, 0);
  assert.equal(m.dsv4_cache_pool_bytes_used, 0, 'no request runs: the pool is empty');
  assert.ok(m.dsv4_cache_pool_bytes_total > 0);
  assert.ok(m.dsv4_resident_memory_bytes > 10 << 20, `RSS ${m.dsv4_resident_memory_bytes}`);
});
