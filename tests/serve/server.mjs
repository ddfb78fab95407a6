// The shared harness of the `dsv4 serve` tests (docs/SERVER.md).
//
// Environment (CTest sets these; defaults fit a run from the source tree):
//   DSV4_BIN         the dsv4 binary                   (SOURCE/build/dsv4)
//   DSV4_SOURCE_DIR  the source tree (for .cache/tokenizer)  (this file's ../..)
//   DSV4_SERVE_WORK  where the test model, screenshots and logs go
//                    (dirname(DSV4_BIN)/serve-tests)
//   DSV4_SERVE_SCALE a factor (0..1] on the sizes of the load and fuzz
//                    phases (scripts/sanitize.sh sets it smaller)
//   DSV4_SERVE_THREADS  --threads of the servers (default 2)
//
// makeModel() makes the test model once per binary (the tiny preset with
// DeepSeek-V4's vocabulary and tokenizer, as scripts/run.sh does), cached in
// the work folder. startServer() starts `dsv4 serve --port 0` on 127.0.0.1,
// reads the port from its stderr and waits for /health 200; stop() sends
// SIGTERM and checks that it exits 0 within the deadline.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

const here = path.dirname(fileURLToPath(import.meta.url));
export const SOURCE_DIR = path.resolve(process.env.DSV4_SOURCE_DIR || path.join(here, '..', '..'));
export const BIN = path.resolve(process.env.DSV4_BIN || path.join(SOURCE_DIR, 'build', 'dsv4'));
export const WORK = path.resolve(process.env.DSV4_SERVE_WORK || path.join(path.dirname(BIN), 'serve-tests'));
export const SCALE = Math.min(1, Math.max(0.01, Number(process.env.DSV4_SERVE_SCALE || 1)));
// Under a sanitizer build the RSS bounds are not checked: ASan holds freed
// memory in its quarantine (256 MiB by default), so RSS says nothing there;
// LeakSanitizer checks leaks instead, when the server exits (a leak makes
// its exit status non-zero, which stop() fails on).
export const SANITIZED = process.env.DSV4_SERVE_SANITIZED === '1';
export const THREADS = process.env.DSV4_SERVE_THREADS || '2';
export const TOKENIZER = path.join(SOURCE_DIR, '.cache', 'tokenizer', 'deepseek-v4', 'tokenizer.json');

fs.mkdirSync(WORK, { recursive: true });

// The model directory: made once per (binary, tokenizer) and reused. Made
// under a temporary name and renamed, so parallel tests never see half of it.
export function makeModel() {
  assert.ok(fs.existsSync(BIN), `no dsv4 binary at ${BIN}`);
  assert.ok(fs.existsSync(TOKENIZER), `no tokenizer at ${TOKENIZER} (run scripts/setup.sh)`);
  const b = fs.statSync(BIN), t = fs.statSync(TOKENIZER);
  const key = `${Math.floor(b.mtimeMs)}-${b.size}-${Math.floor(t.mtimeMs)}`;
  const dir = path.join(WORK, `model-${key}`, 'default');
  if (fs.existsSync(path.join(dir, 'tokenizer.json'))) return dir;
  const tmp = path.join(WORK, `tmp-model-${process.pid}-${Date.now()}`);
  fs.rmSync(tmp, { recursive: true, force: true });
  execFileSync(BIN, ['gen-model', '--preset', 'tiny', '--vocab', '129280', '--seed', '0', '--out', path.join(tmp, 'default')],
               { stdio: ['ignore', 'ignore', 'inherit'] });
  fs.copyFileSync(TOKENIZER, path.join(tmp, 'default', 'tokenizer.json'));
  try {
    fs.renameSync(tmp, path.dirname(dir));
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });  // another test made it first
    if (!fs.existsSync(path.join(dir, 'tokenizer.json'))) throw e;
  }
  // Models of older binaries go (best effort; never the one in use).
  for (const name of fs.readdirSync(WORK)) {
    if (name.startsWith('model-') && name !== `model-${key}`) {
      const p = path.join(WORK, name);
      if (Date.now() - fs.statSync(p).mtimeMs > 3600e3) fs.rmSync(p, { recursive: true, force: true });
    }
  }
  return dir;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts `dsv4 serve` with `args` (strings, e.g. ['--parallel', '2']).
// Returns a handle: url, port, proc, log() (stderr so far), get/post/metrics
// helpers, stop().
export async function startServer(args = [], { model = makeModel(), waitHealthy = true, timeoutMs = 120e3, env = {} } = {}) {
  const fullArgs = ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', THREADS, ...args];
  const proc = spawn(BIN, fullArgs, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let err = '', out = '';
  let exited = null;
  const exitPromise = new Promise((resolve) => proc.on('exit', (code, signal) => { exited = { code, signal }; resolve(exited); }));
  proc.stdout.on('data', (d) => { out += d; });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no "listening on" line within ${timeoutMs} ms; stderr:\n${err}`)), timeoutMs);
    proc.stderr.on('data', (d) => {
      err += d;
      const m = /dsv4 serve: listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    exitPromise.then((e) => { clearTimeout(timer); reject(new Error(`dsv4 serve exited (${JSON.stringify(e)}) before listening; stderr:\n${err}`)); });
  });
  const url = `http://127.0.0.1:${port}`;
  const s = {
    url, port, proc, args: fullArgs,
    log: () => err,
    stdout: () => out,
    exited: () => exited,
    exitPromise,
    alive: () => exited === null,
    async get(p, headers = {}) { return fetch(url + p, { headers }); },
    async post(p, body, headers = {}) {
      return fetch(url + p, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
      });
    },
    async json(p, body, headers = {}) {
      const r = await s.post(p, body, headers);
      const text = await r.text();
      let j = null;
      try { j = JSON.parse(text); } catch { /* left null */ }
      return { status: r.status, headers: r.headers, body: j, text };
    },
    async metrics(headers = {}) { return parseMetrics(await (await s.get('/metrics', headers)).text()); },
    // /metrics once nothing runs or waits (a request whose answer is out may
    // still take a step: the prefix cache keeps the state after the answer).
    async settled(headers = {}, ms = 10e3) {
      const end = Date.now() + ms;
      for (;;) {
        const m = await s.metrics(headers);
        if ((m.dsv4_requests_running === 0 && m.dsv4_requests_queued === 0) || Date.now() > end) return m;
        await sleep(50);
      }
    },
    // SIGTERM; the process must exit 0 within deadlineMs.
    async stop({ deadlineMs = 30e3, signal = 'SIGTERM' } = {}) {
      if (exited === null && signal) proc.kill(signal);
      // The deadline's timer is cleared once the process exits: left pending it
      // would keep node alive for the rest of it after the last test.
      let timer;
      const deadline = new Promise((resolve) => { timer = setTimeout(() => resolve(null), deadlineMs); });
      const e = await Promise.race([exitPromise, deadline]);
      clearTimeout(timer);
      if (e === null) {
        proc.kill('SIGKILL');
        await exitPromise;
        throw new Error(`dsv4 serve did not exit within ${deadlineMs} ms of ${signal}; stderr:\n${tail(err)}`);
      }
      assert.deepEqual(e, { code: 0, signal: null }, `dsv4 serve exit status after ${signal}; stderr:\n${tail(err)}`);
    },
    // Kills it without checks (for cleanup after a failure).
    kill() { if (exited === null) proc.kill('SIGKILL'); },
  };
  process.on('exit', () => s.kill());
  if (waitHealthy) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (exited) throw new Error(`dsv4 serve exited (${JSON.stringify(exited)}) while loading; stderr:\n${err}`);
      try {
        const r = await fetch(url + '/health');
        const b = await r.text();
        if (r.status === 200) { assert.deepEqual(JSON.parse(b), { status: 'ok' }); break; }
        assert.equal(r.status, 503, `/health while loading: ${r.status} ${b}`);
      } catch (e) {
        if (e instanceof assert.AssertionError) throw e;
      }
      if (Date.now() > deadline) throw new Error(`/health not 200 within ${timeoutMs} ms; stderr:\n${err}`);
      await sleep(50);
    }
  }
  return s;
}

export function tail(s, n = 4000) { return s.length > n ? '...' + s.slice(-n) : s; }

// Prometheus text → { name: value } for unlabelled samples (labelled ones
// keep their `name{labels}` key). TYPE lines are collected in `types`.
export function parseMetrics(text) {
  const values = {}, types = {};
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const t = /^# TYPE (\S+) (\S+)/.exec(line);
    if (t) { types[t[1]] = t[2]; continue; }
    if (line.startsWith('#')) continue;
    const m = /^(\S+?(?:\{[^}]*\})?)\s+(\S+)(?:\s+\d+)?$/.exec(line);
    if (m) values[m[1]] = Number(m[2]);
  }
  return Object.assign(values, { [Symbol.for('types')]: types });
}
export const metricTypes = (m) => m[Symbol.for('types')];

// Every metric name in docs/SERVER.md, with its kind.
export const METRICS = {
  dsv4_requests_running: 'gauge', dsv4_requests_queued: 'gauge',
  dsv4_requests_total: 'counter', dsv4_requests_rejected_total: 'counter',
  dsv4_requests_cancelled_total: 'counter', dsv4_requests_failed_total: 'counter',
  dsv4_prompt_tokens_total: 'counter', dsv4_cached_tokens_total: 'counter', dsv4_generated_tokens_total: 'counter',
  dsv4_cache_pool_bytes_used: 'gauge', dsv4_cache_pool_bytes_total: 'gauge',
  dsv4_prefix_cache_bytes: 'gauge', dsv4_prefix_cache_entries: 'gauge',
  dsv4_prefill_tokens_per_second: 'gauge', dsv4_decode_tokens_per_second: 'gauge',
  dsv4_resident_memory_bytes: 'gauge',
};

// Reads a text/event-stream body: returns { events: [parsed JSON or the
// string '[DONE]'], comments: [':...' lines], raw, times: [ms since start
// per event] }. Fails on a data line after [DONE] or one that is not JSON.
export async function readSSE(response, { onEvent } = {}) {
  const t0 = Date.now();
  const dec = new TextDecoder();
  let buf = '', raw = '';
  const events = [], comments = [], times = [];
  let done = false;
  const handle = (block) => {
    for (const line of block.split('\n')) {
      if (line === '') continue;
      if (line.startsWith(':')) { comments.push(line); continue; }
      if (!line.startsWith('data:')) continue;  // event:/id:/retry: are allowed, unused
      const data = line.slice(5).trimStart();
      assert.ok(!done, `SSE data after [DONE]: ${data}`);
      if (data === '[DONE]') { done = true; events.push('[DONE]'); times.push(Date.now() - t0); continue; }
      let j;
      try { j = JSON.parse(data); } catch { assert.fail(`SSE data is not JSON: ${data}`); }
      events.push(j); times.push(Date.now() - t0);
      if (onEvent) onEvent(j);
    }
  };
  for await (const chunk of response.body) {
    const s = dec.decode(chunk, { stream: true });
    raw += s; buf += s;
    buf = buf.replace(/\r\n/g, '\n');
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) { handle(buf.slice(0, i)); buf = buf.slice(i + 2); }
  }
  if (buf.trim()) handle(buf);
  return { events, comments, raw, times };
}

// A chat message list of about `words` words.
export function chatOf(text) { return [{ role: 'user', content: text }]; }
export function wordsText(n, seed = 1) {
  const words = ['alpha', 'river', 'stone', 'cloud', 'seven', 'green', 'market', 'piano', 'window', 'orbit', 'lemon', 'forest'];
  let x = seed >>> 0 || 1;
  const out = [];
  for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) >>> 0; out.push(words[(x >>> 16) % words.length]); }
  return out.join(' ');
}

// Checks an error response against the contract's shape.
export function assertError(res, status, type, code, what = '') {
  assert.equal(res.status, status, `${what}: status (body ${tail(res.text ?? '', 400)})`);
  assert.ok(res.body && typeof res.body === 'object', `${what}: error body is not JSON: ${tail(res.text ?? '', 400)}`);
  const e = res.body.error;
  assert.ok(e && typeof e === 'object', `${what}: no "error" object: ${res.text}`);
  assert.equal(typeof e.message, 'string', `${what}: error.message`);
  assert.ok(e.message.length > 0, `${what}: empty error.message`);
  assert.equal(e.type, type, `${what}: error.type in ${res.text}`);
  assert.equal(e.code, code, `${what}: error.code in ${res.text}`);
  assert.ok('param' in e, `${what}: error.param missing in ${res.text}`);
  assert.ok(e.param === null || typeof e.param === 'string', `${what}: error.param is null or a string`);
}
