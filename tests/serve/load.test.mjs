// dsv4 serve under load (docs/SERVER.md; tools/serve/scheduler.h: "whatever
// else runs, the same request gives the same tokens"). A set of distinct
// requests (prompt lengths, max_tokens, streamed or not, greedy or seeded
// sampling, penalties and logit biases, JSON mode, return_token_ids) is first run alone, one after another, for
// reference token ids; then 32 clients send them concurrently to a server
// with --parallel 8 --max-queue 16, for a bounded count and time. Every
// answer must carry exactly the reference ids; every request gets exactly one
// final answer (success or 429); no other errors; afterwards nothing runs or
// waits, the cache pool is as idle and the RSS near the idle baseline.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, readSSE, wordsText, sleep, SCALE, tail, SANITIZED } from './server.mjs';

let s;
before(async () => { s = await startServer(['--parallel', '8', '--max-queue', '16', '--prefix-cache-mb', '64']); });
after(async () => { await s?.stop(); });

// The distinct requests.
const specs = [];
{
  const lengths = [3, 20, 60, 150, 300];
  const maxTokens = [1, 4, 12, 24, 40];
  for (let i = 0; i < 16; i++) {
    const chat = i % 4 !== 3;
    const stream = i % 2 === 1;
    const greedy = i % 3 === 0;
    const words = lengths[i % lengths.length];
    const body = {
      model: 'default',
      max_tokens: maxTokens[(i * 3) % maxTokens.length],
      return_token_ids: true,
      ignore_eos: i % 5 === 0,
      ...(greedy ? { temperature: 0 } : { temperature: 0.9, top_p: 0.95, seed: 1000 + i }),
      ...(i % 4 === 1 ? { presence_penalty: 0.4, frequency_penalty: 0.6 } : {}),
      ...(i % 8 === 2 ? { logit_bias: { [100 + i]: 4, [200 + i]: -50 } } : {}),
      ...(i % 8 === 6 ? { response_format: { type: 'json_object' } } : {}),
      ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
      ...(chat ? { messages: [{ role: 'user', content: `Request ${i}: ${wordsText(words, i + 1)}` }] }
        : { prompt: `Request ${i}: ${wordsText(words, i + 1)}` }),
    };
    specs.push({ i, path: chat ? '/v1/chat/completions' : '/v1/completions', body, chat, stream });
  }
}

// Sends one request; returns { status, ids, promptIds, finishes, usage, text, retryAfter }.
async function send(spec) {
  const res = await s.post(spec.path, spec.body);
  if (res.status !== 200) return { status: res.status, text: await res.text(), retryAfter: res.headers.get('retry-after') };
  if (!spec.stream) {
    const j = await res.json();
    assert.equal(j.choices.length, 1);
    const c = j.choices[0];
    assert.ok(Array.isArray(c.token_ids), `return_token_ids: choice.token_ids (${JSON.stringify(c).slice(0, 300)})`);
    assert.ok(Array.isArray(j.prompt_token_ids), 'return_token_ids: prompt_token_ids');
    return { status: 200, ids: c.token_ids, promptIds: j.prompt_token_ids, finishes: [c.finish_reason], usage: j.usage };
  }
  const { events } = await readSSE(res);
  assert.equal(events.at(-1), '[DONE]', 'a stream ends with [DONE]');
  assert.equal(events.filter((e) => e === '[DONE]').length, 1);
  const ids = [], finishes = [];
  let usage = null, promptIds = null;
  for (const e of events.slice(0, -1)) {
    assert.ok(!e.error, `an error event: ${JSON.stringify(e)}`);
    if (e.usage) { assert.equal(usage, null, 'one usage chunk'); usage = e.usage; }
    if (e.prompt_token_ids) promptIds = e.prompt_token_ids;
    for (const c of e.choices) {
      if (c.token_ids) ids.push(...c.token_ids);
      if (c.finish_reason) finishes.push(c.finish_reason);
    }
  }
  return { status: 200, ids, promptIds, finishes, usage };
}

test('32 concurrent clients get exactly the tokens each request gets alone', { timeout: 600e3 }, async () => {
  // Alone, one after another.
  const ref = [];
  for (const spec of specs) {
    const r = await send(spec);
    assert.equal(r.status, 200, `request ${spec.i} alone: ${r.text}`);
    assert.equal(r.finishes.length, 1, `request ${spec.i}: one finish_reason`);
    assert.ok(r.ids.length >= 1 && r.ids.length <= spec.body.max_tokens, `request ${spec.i}: ${r.ids.length} ids`);
    assert.equal(r.usage.completion_tokens, r.ids.length, `request ${spec.i}: completion_tokens = token_ids`);
    if (spec.body.ignore_eos) assert.equal(r.ids.length, spec.body.max_tokens);
    ref.push(r);
  }
  // A second alone run of a seeded and a greedy request: the reference is
  // reproducible at all (else the comparison below means nothing).
  for (const k of [0, 1]) assert.deepEqual((await send(specs[k])).ids, ref[k].ids, `request ${k} twice alone`);

  const idle = await s.settled();
  assert.equal(idle.dsv4_requests_running, 0);
  assert.equal(idle.dsv4_cache_pool_bytes_used, 0);

  // The load: 32 clients, each its own request sequence, until TOTAL have
  // been answered (a 429 is not an answer: its client waits Retry-After and
  // sends its next one) or SECONDS pass; then what the server has admitted
  // (--parallel + --max-queue requests) is answered. How many 429s come
  // depends on the machine's speed (a slower server keeps its queue full
  // longer), so 429s do not count towards the total, and the count bound,
  // MAX_SENT, is one no working server reaches: a client sends at most one
  // request a second while rejected. (A TSan server on two cores answers
  // about one request in five seconds: ~25 in the window, ~25 after it.)
  const CLIENTS = 32, TOTAL = Math.max(64, Math.round(320 * SCALE)), SECONDS = 120;
  const MAX_SENT = TOTAL + CLIENTS * SECONDS;
  const end = Date.now() + SECONDS * 1000;
  let sent = 0, answered = 0;
  const outcomes = new Map();  // request number → outcome
  const mismatches = [], errors = [];
  let generated = 0;
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
    for (let k = 0; ; k++) {
      if (answered >= TOTAL || sent >= MAX_SENT || Date.now() > end) return;
      const n = sent++;
      const spec = specs[(c * 7 + k * 5) % specs.length];
      let r;
      try {
        r = await send(spec);
      } catch (e) {
        errors.push(`#${n} (request ${spec.i}): ${e.message}`);
        outcomes.set(n, 'error');
        answered++;
        continue;
      }
      assert.ok(!outcomes.has(n), `request #${n} answered twice`);
      if (r.status === 429) {
        outcomes.set(n, 429);
        if (r.retryAfter !== '1') errors.push(`#${n}: 429 without Retry-After: 1`);
        await sleep(1000 * (Number(r.retryAfter) || 1) + (n % 7) * 30);  // as Retry-After says
        continue;
      }
      answered++;
      if (r.status !== 200) { errors.push(`#${n} (request ${spec.i}): ${r.status} ${tail(r.text ?? '', 300)}`); outcomes.set(n, r.status); continue; }
      outcomes.set(n, 200);
      if (r.finishes.length !== 1) errors.push(`#${n} (request ${spec.i}): ${r.finishes.length} finish_reasons`);
      generated += r.usage?.completion_tokens ?? 0;
      const want = ref[spec.i];
      if (JSON.stringify(r.ids) !== JSON.stringify(want.ids) ||
          (r.promptIds && want.promptIds && JSON.stringify(r.promptIds) !== JSON.stringify(want.promptIds))) {
        mismatches.push(`#${n} (request ${spec.i}, ${spec.stream ? 'streamed' : 'plain'}, ${spec.body.temperature === 0 ? 'greedy' : 'seeded'}): ` +
                        `got ${JSON.stringify(r.ids)} alone ${JSON.stringify(want.ids)}`);
      }
    }
  }));
  const secs = (Date.now() - t0) / 1000;
  const counts = {};
  for (const v of outcomes.values()) counts[v] = (counts[v] ?? 0) + 1;
  console.log(`load: ${sent} requests in ${secs.toFixed(1)} s from ${CLIENTS} clients: ${JSON.stringify(counts)}; ${generated} tokens generated (${(generated / secs).toFixed(0)}/s)`);
  assert.equal(outcomes.size, sent, 'every request got exactly one answer');
  assert.deepEqual(errors, [], 'no errors but 429s');
  assert.deepEqual(mismatches, [], 'every answer carries the ids of the request alone');
  // The load really ran: at least one answer per client on average.
  assert.ok((counts[200] ?? 0) >= CLIENTS, `answers under load: ${JSON.stringify(counts)}`);

  // Afterwards.
  const m = await s.settled();
  assert.equal(m.dsv4_requests_running, 0, 'running after the load');
  assert.equal(m.dsv4_requests_queued, 0, 'queued after the load');
  assert.equal(m.dsv4_cache_pool_bytes_used, idle.dsv4_cache_pool_bytes_used, 'the cache pool as idle');
  assert.equal(m.dsv4_requests_rejected_total - idle.dsv4_requests_rejected_total, counts[429] ?? 0, 'dsv4_requests_rejected_total counts the 429s');
  assert.equal(m.dsv4_generated_tokens_total - idle.dsv4_generated_tokens_total, generated, 'dsv4_generated_tokens_total counts the tokens answered');
  assert.equal(m.dsv4_requests_failed_total, 0);
  const grow = m.dsv4_resident_memory_bytes - idle.dsv4_resident_memory_bytes;
  const prefixGrow = Math.max(0, m.dsv4_prefix_cache_bytes - idle.dsv4_prefix_cache_bytes);
  console.log(`load: RSS ${(idle.dsv4_resident_memory_bytes / 2 ** 20).toFixed(1)} → ${(m.dsv4_resident_memory_bytes / 2 ** 20).toFixed(1)} MiB`);
  if (!SANITIZED) assert.ok(grow <= prefixGrow + (96 << 20), `RSS grew by ${(grow / 2 ** 20).toFixed(1)} MiB (prefix cache +${(prefixGrow / 2 ** 20).toFixed(1)} MiB)`);
  // And a request alone still gives its reference.
  assert.deepEqual((await send(specs[3])).ids, ref[3].ids);
});
