#!/usr/bin/env node
// Throughput and time-to-first-token of `dsv4 serve` (docs/SERVER.md) under
// concurrency. One fixed set of streamed chat requests (mixed prompt lengths,
// ignore_eos so that every run generates the same number of tokens) is sent
// one after another (sequential), then by 1, 4 and 16 concurrent clients.
// Prints, per run: generated tokens/s, its ratio to the sequential run, and
// time-to-first-token p50/p99 (first streamed token, from the request's
// start). It is a program, not a test; it sends traffic only to the URL it
// is given or to the server it starts on 127.0.0.1.
//
//   node bench/serve_bench.mjs --url http://127.0.0.1:8080 [--model-name NAME]
//   node bench/serve_bench.mjs --model models/default [--bin build/dsv4] [--serve-args "--parallel 16"]
//   options: --requests N (per run, default 32)  --max-tokens N (default 64)
//            --concurrency 1,4,16  --prompt-words 20,200,1000  --api-key KEY  --json
//            --no-sequential (skip the sequential run: no ratios; to compare
//            server settings at one concurrency)
//
// It uses only node's own modules (node >= 18), so it runs without
// tests/serve/node_modules.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(`--${name}`); return i >= 0 ? args[i + 1] : def; };
const flag = (name) => args.includes(`--${name}`);
if (flag('help')) {
  console.log('usage: node bench/serve_bench.mjs (--url URL | --model DIR) [--requests N] [--max-tokens N] [--concurrency 1,4,16] [--prompt-words 20,200,1000] [--no-sequential] [--json]');
  process.exit(0);
}

const N = Number(opt('requests', 32));
const MAX_TOKENS = Number(opt('max-tokens', 64));
const CONC = opt('concurrency', '1,4,16').split(',').map(Number);
const WORDS = opt('prompt-words', '20,200,1000').split(',').map(Number);
const JSON_OUT = flag('json');
const KEY = opt('api-key', null);
const log = (...a) => { if (!JSON_OUT) console.log(...a); else console.error(...a); };

let server = null, url = opt('url', null);
async function start() {
  const bin = opt('bin', path.join(here, '..', 'build', 'dsv4'));
  const model = opt('model', null);
  if (!model) throw new Error('give --url URL or --model DIR');
  const extra = (opt('serve-args', '') || '').split(/\s+/).filter(Boolean);
  server = spawn(bin, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const port = await new Promise((resolve, reject) => {
    server.stderr.on('data', (d) => {
      err += d;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
      if (m) resolve(Number(m[1]));
    });
    server.on('exit', (c) => reject(new Error(`dsv4 serve exited ${c}: ${err}`)));
  });
  url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try { if ((await fetch(url + '/health')).status === 200) break; } catch { /* not yet */ }
    if (i > 6000) throw new Error('the server did not get ready in 10 minutes');
    await new Promise((r) => setTimeout(r, 100));
  }
}

const headers = { 'content-type': 'application/json', ...(KEY ? { authorization: `Bearer ${KEY}` } : {}) };
const words = ['alpha', 'river', 'stone', 'cloud', 'seven', 'green', 'market', 'piano', 'window', 'orbit', 'lemon', 'forest'];
function prompt(n, seed) {
  let x = seed;
  return Array.from({ length: n }, () => { x = (x * 1103515245 + 12345) >>> 0; return words[(x >>> 16) % words.length]; }).join(' ');
}

// One streamed request; returns { ttft (s), tokens, seconds }.
async function one(model, i) {
  const body = {
    model, stream: true, stream_options: { include_usage: true }, max_tokens: MAX_TOKENS, ignore_eos: true,
    temperature: 0.8, seed: i,
    // A distinct first word per request keeps the prefix cache from making
    // later runs cheaper than the first.
    messages: [{ role: 'user', content: `${i}-${Date.now()} ${prompt(WORDS[i % WORDS.length], i + 1)}` }],
  };
  const t0 = performance.now();
  const res = await fetch(url + '/v1/chat/completions', { method: 'POST', headers, body: JSON.stringify(body) });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let ttft = null, tokens = 0, buf = '';
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const line = buf.slice(0, k).trim();
      buf = buf.slice(k + 2);
      if (!line.startsWith('data:')) continue;
      const d = line.slice(5).trim();
      if (d === '[DONE]') continue;
      const j = JSON.parse(d);
      if (j.error) throw new Error(JSON.stringify(j.error));
      if (j.usage) tokens = j.usage.completion_tokens;
      const delta = j.choices?.[0]?.delta;
      if (ttft === null && delta && ((delta.content ?? '') !== '' || (delta.reasoning_content ?? '') !== '' || delta.tool_calls)) ttft = (performance.now() - t0) / 1000;
    }
  }
  return { ttft: ttft ?? (performance.now() - t0) / 1000, tokens, seconds: (performance.now() - t0) / 1000 };
}

const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))]; };

async function run(model, concurrency) {
  const results = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < N) { const i = next++; results.push(await one(model, i)); }
  }));
  const seconds = (performance.now() - t0) / 1000;
  const tokens = results.reduce((a, r) => a + r.tokens, 0);
  const ttfts = results.map((r) => r.ttft);
  return { concurrency, requests: results.length, tokens, seconds, tokens_per_second: tokens / seconds,
           ttft_p50: pct(ttfts, 50), ttft_p99: pct(ttfts, 99) };
}

try {
  if (!url) await start();
  const models = await (await fetch(url + '/v1/models', { headers })).json();
  const model = opt('model-name', models.data[0].id);
  log(`serve_bench: ${url}, model ${model}, ${N} requests per run, ${MAX_TOKENS} tokens each, prompts of ${WORDS.join('/')} words`);
  await one(model, 999);  // warm-up
  const runs = [];
  const seq = flag('no-sequential') ? null : await run(model, 1);
  if (seq) runs.push({ name: 'sequential', ...seq });
  for (const c of CONC) runs.push({ name: `concurrency ${c}`, ...(await run(model, c)) });
  for (const r of runs) r.ratio_to_sequential = seq ? r.tokens_per_second / seq.tokens_per_second : null;
  if (JSON_OUT) {
    console.log(JSON.stringify({ url, model, requests_per_run: N, max_tokens: MAX_TOKENS, prompt_words: WORDS, runs }, null, 2));
  } else {
    console.log('run              requests  tokens   seconds   tokens/s   x seq   TTFT p50   TTFT p99');
    for (const r of runs) {
      console.log(`${r.name.padEnd(16)} ${String(r.requests).padStart(8)} ${String(r.tokens).padStart(7)} ${r.seconds.toFixed(2).padStart(9)} ` +
                  `${r.tokens_per_second.toFixed(1).padStart(10)} ${(r.ratio_to_sequential?.toFixed(2) ?? '-').padStart(7)} ` +
                  `${(r.ttft_p50 * 1000).toFixed(0).padStart(8)} ms ${(r.ttft_p99 * 1000).toFixed(0).padStart(7)} ms`);
    }
  }
} finally {
  if (server) {
    server.kill('SIGTERM');
    await new Promise((r) => server.on('exit', r));
  }
}
