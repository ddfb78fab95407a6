// dsv4 serve through the official `openai` npm client (docs/SERVER.md):
// chat, streamed chat, completions, tools, thinking, logprobs, seeds, the
// prefix cache across turns, and the client's error classes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

const KEY = 'sk-dsv4-test-key';
let s, guarded, client;
before(async () => {
  [s, guarded] = await Promise.all([
    startServer(),
    startServer(['--api-key', KEY, '--max-context', '64', '--model-name', 'guarded']),
  ]);
  client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120e3 });
});
after(async () => { await Promise.all([s?.stop(), guarded?.stop()]); });

const M = 'default';
const user = (content) => ({ role: 'user', content });
const isInt = Number.isInteger;

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}
function assemble(chunks) {
  let content = '', reasoning = '', finish = null, usage = null, reasoningDeltas = 0, contentDeltas = 0;
  const toolCalls = [];
  for (const c of chunks) {
    assert.equal(c.object, 'chat.completion.chunk');
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      const d = ch.delta ?? {};
      if (typeof d.content === 'string') { content += d.content; if (d.content) contentDeltas++; }
      if (typeof d.reasoning_content === 'string') { reasoning += d.reasoning_content; if (d.reasoning_content) reasoningDeltas++; }
      for (const t of d.tool_calls ?? []) toolCalls.push(t);
      if (ch.finish_reason) { assert.equal(finish, null, 'one finish_reason per stream'); finish = ch.finish_reason; }
    }
  }
  return { content, reasoning, finish, usage, toolCalls, reasoningDeltas, contentDeltas };
}

test('chat: one answer, well formed', async () => {
  const r = await client.chat.completions.create({ model: M, messages: [user('Say hello.')], max_tokens: 10, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, M);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens <= 10);
});

test('streamed chat assembles to the unstreamed answer at temperature 0', async () => {
  const req = { model: M, messages: [user('Count to five.')], max_tokens: 24, temperature: 0, ignore_eos: true };
  const plain = await client.chat.completions.create(req);
  const chunks = await collect(await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
  const a = assemble(chunks);
  assert.equal(a.content, plain.choices[0].message.content);
  assert.equal(a.finish, plain.choices[0].finish_reason);
  assert.equal(a.finish, 'length');
  assert.deepEqual(a.usage, plain.usage);
  assert.ok(a.contentDeltas >= 2, `the text came in pieces (${a.contentDeltas} deltas)`);
});

test('completions, plain and streamed', async () => {
  const req = { model: M, prompt: 'The capital of France is', max_tokens: 8, temperature: 0, ignore_eos: true };
  const r = await client.completions.create(req);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  let text = '';
  for await (const c of await client.completions.create({ ...req, stream: true })) text += c.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

function checkToolCalls(msg, finish) {
  if (msg.tool_calls === undefined || msg.tool_calls === null) {
    assert.ok(['stop', 'length'].includes(finish), `finish_reason ${finish} without tool_calls`);
    return;
  }
  assert.ok(Array.isArray(msg.tool_calls) && msg.tool_calls.length > 0, 'tool_calls only when there are some');
  assert.equal(finish, 'tool_calls');
  for (const t of msg.tool_calls) {
    assert.equal(typeof t.id, 'string');
    assert.equal(t.type, 'function');
    assert.equal(typeof t.function.name, 'string');
    assert.equal(typeof t.function.arguments, 'string');
  }
}

test('tools: accepted, rendered into the prompt, well-formed answers', async () => {
  const messages = [user('What is the weather in Paris?')];
  const base = await client.chat.completions.create({ model: M, messages, max_tokens: 16, temperature: 0 });
  const withTools = await client.chat.completions.create({ model: M, messages, tools: [weatherTool], max_tokens: 16, temperature: 0 });
  const auto = await client.chat.completions.create({ model: M, messages, tools: [weatherTool], tool_choice: 'auto', max_tokens: 16, temperature: 0 });
  const none = await client.chat.completions.create({ model: M, messages, tools: [weatherTool], tool_choice: 'none', max_tokens: 16, temperature: 0 });
  for (const r of [base, withTools, auto, none]) checkToolCalls(r.choices[0].message, r.choices[0].finish_reason);
  assert.ok(withTools.usage.prompt_tokens > base.usage.prompt_tokens + 10, 'the tools are in the prompt');
  assert.equal(auto.usage.prompt_tokens, withTools.usage.prompt_tokens, 'tool_choice auto is the default');
  assert.equal(none.usage.prompt_tokens, base.usage.prompt_tokens, 'tool_choice none: no tools in the prompt');
  // Streamed with tools: the same answer.
  const a = assemble(await collect(await client.chat.completions.create(
    { model: M, messages, tools: [weatherTool], max_tokens: 16, temperature: 0, stream: true })));
  assert.equal(a.content, withTools.choices[0].message.content ?? '');
  assert.equal(a.finish, withTools.choices[0].finish_reason);
  for (const t of a.toolCalls) {
    assert.ok(isInt(t.index) && typeof t.id === 'string' && t.type === 'function' && typeof t.function.name === 'string' &&
              typeof t.function.arguments === 'string', `each call whole in one delta: ${JSON.stringify(t)}`);
  }
});

test('a conversation with an assistant tool call and its result renders and is answered', async () => {
  const first = [user('What is the weather in Paris?')];
  const messages = [
    ...first,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_0', content: '{"temperature_c": 21, "sky": "clear"}' },
  ];
  const r0 = await client.chat.completions.create({ model: M, messages: first, tools: [weatherTool], max_tokens: 8, temperature: 0 });
  const r = await client.chat.completions.create({ model: M, messages, tools: [weatherTool], max_tokens: 16, temperature: 0 });
  checkToolCalls(r.choices[0].message, r.choices[0].finish_reason);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(r.usage.prompt_tokens > r0.usage.prompt_tokens + 10, 'the call and its result are in the prompt');
});

test('thinking: reasoning_content apart from content, streamed as reasoning_content deltas', async () => {
  const req = { model: M, messages: [user('Why is the sky blue?')], max_tokens: 24, temperature: 0, thinking: { type: 'enabled' } };
  const r = await client.chat.completions.create(req);
  const msg = r.choices[0].message;
  assert.equal(typeof msg.reasoning_content, 'string', `reasoning_content in thinking mode: ${JSON.stringify(msg)}`);
  assert.equal(typeof msg.content, 'string');
  const off = await client.chat.completions.create({ ...req, thinking: { type: 'disabled' } });
  assert.ok(!('reasoning_content' in off.choices[0].message), 'no reasoning_content when thinking is disabled');
  const a = assemble(await collect(await client.chat.completions.create({ ...req, stream: true })));
  assert.equal(a.reasoning, msg.reasoning_content);
  assert.equal(a.content, msg.content);
  assert.equal(a.finish, r.choices[0].finish_reason);
  if (msg.reasoning_content.length > 0) assert.ok(a.reasoningDeltas >= 1, 'reasoning came as reasoning_content deltas');
  // reasoning_effort is accepted.
  const e = await client.chat.completions.create({ ...req, reasoning_effort: 'high', max_tokens: 4 });
  assert.equal(typeof e.choices[0].message.reasoning_content, 'string');
});

test('logprobs and top_logprobs (chat): shapes; greedy picks the top alternative', async () => {
  const r = await client.chat.completions.create({
    model: M, messages: [user('Hi')], max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs;
  assert.ok(lp && Array.isArray(lp.content), `logprobs.content: ${JSON.stringify(lp)}`);
  assert.equal(lp.content.length, r.usage.completion_tokens);
  assert.equal(lp.content.length, 8);
  for (const e of lp.content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(Number.isFinite(e.logprob) && e.logprob <= 0, `logprob ${e.logprob}`);
    assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => isInt(b) && b >= 0 && b < 256));
    assert.equal(e.top_logprobs.length, 3);
    for (let i = 0; i < 3; i++) {
      const t = e.top_logprobs[i];
      assert.equal(typeof t.token, 'string');
      assert.ok(Number.isFinite(t.logprob) && t.logprob <= 0);
      assert.ok(Array.isArray(t.bytes));
      if (i) assert.ok(t.logprob <= e.top_logprobs[i - 1].logprob, 'most likely first');
    }
    assert.equal(e.token, e.top_logprobs[0].token, 'temperature 0 takes the most likely token');
    assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5);
  }
  const without = await client.chat.completions.create({ model: M, messages: [user('Hi')], max_tokens: 2, temperature: 0 });
  assert.equal(without.choices[0].logprobs ?? null, null);
});

test('logprobs (completions): tokens, token_logprobs, top_logprobs, text_offset', async () => {
  const r = await client.completions.create({ model: M, prompt: 'One two three', max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert.ok(lp, 'logprobs');
  assert.equal(lp.tokens.length, 6);
  assert.equal(lp.token_logprobs.length, 6);
  assert.equal(lp.top_logprobs.length, 6);
  assert.equal(lp.text_offset.length, 6);
  for (let i = 0; i < 6; i++) {
    assert.equal(typeof lp.tokens[i], 'string');
    assert.ok(lp.token_logprobs[i] <= 0);
    const alts = Object.entries(lp.top_logprobs[i]);
    assert.ok(alts.length >= 1 && alts.length <= 2, `top_logprobs[${i}]: ${JSON.stringify(lp.top_logprobs[i])}`);
    assert.ok(alts.every(([, v]) => v <= 0));
    assert.ok(Math.abs(Math.max(...alts.map(([, v]) => v)) - lp.token_logprobs[i]) < 1e-5, 'greedy: the top alternative');
    assert.ok(isInt(lp.text_offset[i]) && lp.text_offset[i] >= 0);
    if (i) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1], 'text_offset grows');
  }
});

test('seed: the same seed gives the same text, other seeds other texts (temperature 1)', async () => {
  const req = { model: M, messages: [user('Tell me a story.')], max_tokens: 16, temperature: 1, ignore_eos: true };
  const a = await client.chat.completions.create({ ...req, seed: 42 });
  const b = await client.chat.completions.create({ ...req, seed: 42 });
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  const others = [];
  for (const seed of [1, 2, 3]) others.push((await client.chat.completions.create({ ...req, seed })).choices[0].message.content);
  assert.ok(others.some((t) => t !== a.choices[0].message.content), 'three other seeds all gave the seed-42 text');
  // No seed: a fresh one per request.
  const c = await client.chat.completions.create(req);
  const d = await client.chat.completions.create(req);
  assert.ok(c.choices[0].message.content !== d.choices[0].message.content || c.choices[0].message.content !== a.choices[0].message.content,
            'requests without a seed all gave one text');
});

test('logit_bias steers the choice: +100 makes every token that id, -100 on the greedy pick leaves the runner-up', async () => {
  const req = { model: M, messages: [user('Name a colour.')], max_tokens: 6, temperature: 0, ignore_eos: true, return_token_ids: true };
  const forced = await client.chat.completions.create({ ...req, logit_bias: { 1000: 100 } });
  assert.deepEqual(forced.choices[0].token_ids, Array(6).fill(1000));
  // The logprobs are the model's (before biases): the runner-up is top_logprobs[1].
  const plain = await client.chat.completions.create({ ...req, max_tokens: 1, logprobs: true, top_logprobs: 2 });
  const [first, second] = plain.choices[0].logprobs.content[0].top_logprobs;
  assert.ok(first.logprob > second.logprob, 'no tie at the top');
  const moved = await client.chat.completions.create({ ...req, max_tokens: 1, logprobs: true, logit_bias: { [plain.choices[0].token_ids[0]]: -100 } });
  assert.equal(moved.choices[0].logprobs.content[0].token, second.token);
  // Penalties are accepted and reproducible (the load test checks them in a batch).
  const penalised = { ...req, max_tokens: 12, presence_penalty: 1.5, frequency_penalty: 0.5 };
  const a = await client.chat.completions.create(penalised);
  const b = await client.chat.completions.create(penalised);
  assert.deepEqual(b.choices[0].token_ids, a.choices[0].token_ids);
});

test('tool_choice required or named: the answer opens a tool-call block (after </think> when thinking)', async () => {
  const tokenize = async (content) => {
    const res = await fetch(`${s.url}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content, add_special: false }) });
    return (await res.json()).tokens;
  };
  const tools = [{ type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string' } } } } }];
  const req = { model: M, messages: [user('What time is it?')], tools, max_tokens: 24, temperature: 0, ignore_eos: true, return_token_ids: true };
  const opening = await tokenize('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="');
  const required = await client.chat.completions.create({ ...req, tool_choice: 'required' });
  assert.deepEqual(required.choices[0].token_ids.slice(0, opening.length), opening);
  // Thinking: the reasoning is the model's; a +100 bias makes it end at once.
  const [thinkEnd] = await tokenize('</think>');
  const named = await tokenize('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time">\n');
  const thinking = await client.chat.completions.create({ ...req, thinking: { type: 'enabled' }, logit_bias: { [thinkEnd]: 100 },
    tool_choice: { type: 'function', function: { name: 'get_time' } } });
  const ids = thinking.choices[0].token_ids;
  assert.equal(ids[0], thinkEnd);
  assert.deepEqual(ids.slice(1, 1 + named.length), named);
  await assert.rejects(client.chat.completions.create({ ...req, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    (e) => e.status === 400 && e.param === 'tool_choice');
});

test('response_format reaches the prompt (the system message\'s Response Format section); text adds nothing', async () => {
  const req = { model: M, messages: [user('Give me a JSON object.')], max_tokens: 2, temperature: 0 };
  const plain = (await client.chat.completions.create(req)).usage.prompt_tokens;
  assert.equal((await client.chat.completions.create({ ...req, response_format: { type: 'text' } })).usage.prompt_tokens, plain);
  const schema = { type: 'json_schema', json_schema: { name: 'answer', schema: { type: 'object', properties: { a: { type: 'string' } } } } };
  assert.ok((await client.chat.completions.create({ ...req, response_format: schema })).usage.prompt_tokens > plain + 20);
  await assert.rejects(client.chat.completions.create({ ...req, response_format: { type: 'yaml' } }), (e) => e.status === 400);
});

test('JSON mode (response_format json_object): the content is one JSON object, the answer ends with it', async () => {
  const tokenize = async (content) => {
    const res = await fetch(`${s.url}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content, add_special: false }) });
    return (await res.json()).tokens;
  };
  const [close] = await tokenize('}');
  const [thinkEnd] = await tokenize('</think>');
  const req = { model: M, messages: [user('Reply in JSON.')], response_format: { type: 'json_object' }, max_tokens: 48, ignore_eos: true };
  // A +100 bias on "}": the object closes as soon as it may, and the answer ends there.
  const closed = await client.chat.completions.create({ ...req, temperature: 0, logit_bias: { [close]: 100 } });
  assert.deepEqual(JSON.parse(closed.choices[0].message.content), {});
  assert.equal(closed.choices[0].finish_reason, 'stop');
  assert.ok(closed.usage.completion_tokens < 48);
  // Thinking: the reasoning is free; the object starts after </think>.
  const thinking = await client.chat.completions.create({ ...req, temperature: 0, thinking: { type: 'enabled' },
    logit_bias: { [close]: 100, [thinkEnd]: 100 }, return_token_ids: true });
  assert.equal(thinking.choices[0].token_ids[0], thinkEnd);
  assert.deepEqual(JSON.parse(thinking.choices[0].message.content), {});
  // Free draws: an object that is whole when the answer stops, and a text
  // that starts one either way (random weights rarely close it in 48 tokens).
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({ ...req, temperature: 1, seed });
    const text = r.choices[0].message.content;
    assert.match(text, /^\s*\{/, text);
    if (r.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(text), 'object', text);
    else assert.equal(r.choices[0].finish_reason, 'length');
  }
  // Streamed, the same text.
  const chunks = await collect(await client.chat.completions.create({ ...req, temperature: 1, seed: 1, stream: true }));
  const again = await client.chat.completions.create({ ...req, temperature: 1, seed: 1 });
  assert.equal(assemble(chunks).content, again.choices[0].message.content);
});

test('the second turn of a conversation reuses the first: cached_tokens > 0', async () => {
  const turn1 = [{ role: 'system', content: 'You are a helpful assistant who answers at length.' }, user('Describe a cat in detail.')];
  const r1 = await client.chat.completions.create({ model: M, messages: turn1, max_tokens: 12, temperature: 0 });
  const turn2 = [...turn1, { role: 'assistant', content: r1.choices[0].message.content }, user('And a dog?')];
  const r2 = await client.chat.completions.create({ model: M, messages: turn2, max_tokens: 4, temperature: 0 });
  const k = r2.usage.prompt_tokens_details?.cached_tokens;
  assert.ok(isInt(k) && k > 0, `cached_tokens ${k}`);
  assert.ok(k < r2.usage.prompt_tokens);
  assert.ok(k >= r1.usage.prompt_tokens, `turn 2 reuses at least turn 1's prompt (${k} < ${r1.usage.prompt_tokens})`);
});

async function rejects(promise, Class, status, code) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof Class, `expected ${Class.name}, got ${e?.constructor?.name}: ${e?.message}`);
    assert.equal(e.status, status);
    if (code) assert.equal(e.code, code, `error.code (${e.message})`);
    return e;
  }
  assert.fail(`expected ${Class.name}, the request succeeded`);
}

test('errors: BadRequestError (empty messages, n=2), NotFoundError (unknown model)', async () => {
  await rejects(client.chat.completions.create({ model: M, messages: [], max_tokens: 4 }), OpenAI.BadRequestError, 400, 'invalid_value');
  await rejects(client.chat.completions.create({ model: M, messages: [user('x')], n: 2, max_tokens: 4 }), OpenAI.BadRequestError, 400, 'invalid_value');
  await rejects(client.completions.create({ model: M, prompt: ['a', 'b'], max_tokens: 4 }), OpenAI.BadRequestError, 400);
  await rejects(client.chat.completions.create({ model: 'no-such-model', messages: [user('x')], max_tokens: 4 }), OpenAI.NotFoundError, 404, 'model_not_found');
  const r = await client.chat.completions.create({ model: M, messages: [user('still there?')], max_tokens: 2 });
  assert.equal(r.choices.length, 1);
});

test('errors: AuthenticationError with a wrong key; the right key works; context_length_exceeded', async () => {
  const bad = new OpenAI({ baseURL: `${guarded.url}/v1`, apiKey: 'sk-wrong', maxRetries: 0 });
  await rejects(bad.chat.completions.create({ model: 'guarded', messages: [user('x')], max_tokens: 2 }), OpenAI.AuthenticationError, 401, 'invalid_api_key');
  await rejects(bad.models.list(), OpenAI.AuthenticationError, 401, 'invalid_api_key');
  const good = new OpenAI({ baseURL: `${guarded.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const models = [];
  for await (const m of good.models.list()) models.push(m.id);
  assert.deepEqual(models, ['guarded']);
  const r = await good.chat.completions.create({ model: 'guarded', messages: [user('x')], max_tokens: 2 });
  assert.equal(r.model, 'guarded');
  const long = 'word '.repeat(200);
  const e = await rejects(good.chat.completions.create({ model: 'guarded', messages: [user(long)], max_tokens: 2 }),
    OpenAI.BadRequestError, 400, 'context_length_exceeded');
  assert.match(e.error?.message ?? e.message, /maximum context length is 64 tokens; the prompt has \d+ tokens/);
  const e2 = await rejects(good.completions.create({ model: 'guarded', prompt: long, max_tokens: 2 }), OpenAI.BadRequestError, 400, 'context_length_exceeded');
  const p = Number(/the prompt has (\d+) tokens/.exec(e2.error?.message ?? e2.message)?.[1]);
  assert.ok(p > 64, `the prompt's length in the message: ${e2.message}`);
});
