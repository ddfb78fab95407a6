// The chat page (docs/SERVER.md, "The chat page") in Debian's chromium,
// driven by playwright-core: type a question, send, watch the answer stream
// in; with thinking on, the reasoning fills apart from the content. A
// screenshot goes to the work folder (DSV4_SERVE_WORK) for the record.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { startServer, WORK, sleep } from './server.mjs';

const CHROMIUM = process.env.DSV4_CHROMIUM || '/usr/bin/chromium';
let s, browser;
before(async () => {
  assert.ok(fs.existsSync(CHROMIUM), `no chromium at ${CHROMIUM} (scripts/setup_serve_tests.sh installs Debian's)`);
  [s, browser] = await Promise.all([
    startServer(['--max-context', '384']),
    chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] }),
  ]);
});
after(async () => { await browser?.close(); await s?.stop(); });

// Opens the page, logging every request it makes.
async function openPage() {
  const page = await browser.newPage();
  const requests = [];
  const errors = [];
  page.on('request', (r) => requests.push({ url: r.url(), method: r.method(), body: r.postData() }));
  page.on('pageerror', (e) => errors.push(String(e)));
  const res = await page.goto(s.url + '/');
  assert.equal(res.status(), 200);
  assert.match(res.headers()['content-type'] ?? '', /text\/html/);
  // The page says ready once it can send.
  await page.waitForFunction(() => document.querySelector('div#status')?.textContent.trim() === 'ready', null, { timeout: 60e3 });
  return { page, requests, errors };
}

// Sends `question` and samples the last assistant message's parts until
// #status says ready. Returns the samples and the final texts.
async function ask(page, question, { part = '.content' } = {}) {
  const before = await page.locator('div.message.assistant').count();
  await page.fill('textarea#prompt', question);
  await page.click('button#send');
  const msg = page.locator('div.message.assistant').nth(before);
  await msg.waitFor({ timeout: 60e3 });
  const lengths = new Set();
  const deadline = Date.now() + 120e3;
  for (;;) {
    // One look at the page (no auto-waiting locators: a part may not exist yet).
    const snap = await page.evaluate(({ i, part }) => {
      const m = document.querySelectorAll('div.message.assistant')[i];
      const p = m && m.querySelector(part);
      return { len: p ? p.textContent.length : -1, status: (document.querySelector('div#status')?.textContent ?? '').trim() };
    }, { i: before, part });
    if (snap.len >= 0) lengths.add(snap.len);
    if (snap.status === 'ready') break;
    assert.ok(Date.now() < deadline, `#status never said ready (it says "${snap.status}")`);
    await sleep(10);
  }
  const content = (await msg.locator('.content').first().textContent()) ?? '';
  const reasoning = (await msg.locator('.reasoning').count()) ? (await msg.locator('.reasoning').first().textContent()) ?? '' : '';
  assert.equal(await msg.locator('.content').count(), 1, 'one .content part');
  return { lengths, content, reasoning, msg };
}

test('the page has its elements', async () => {
  const { page, errors } = await openPage();
  for (const sel of ['textarea#prompt', 'button#send', 'input#thinking', 'div#status']) {
    assert.equal(await page.locator(sel).count(), 1, `${sel} on the page`);
  }
  assert.equal(await page.locator('input#thinking').getAttribute('type'), 'checkbox');
  assert.deepEqual(errors, [], 'no script errors');
  await page.close();
});

test('a question streams an answer into .content; #status says ready at the end', { timeout: 200e3 }, async () => {
  const { page, requests, errors } = await openPage();
  const types = [];
  const statuses = [];
  page.on('response', (r) => {
    if (r.url().endsWith('/v1/chat/completions')) { types.push(r.headers()['content-type'] ?? ''); statuses.push(r.status()); }
  });
  const q = 'Write a long poem about the sea, please.';
  const { lengths, content } = await ask(page, q);
  assert.deepEqual(statuses, [200], 'the chat request succeeded');
  assert.ok(content.trim().length > 0, 'the answer is not empty');
  const posts = requests.filter((r) => r.method === 'POST' && r.url.endsWith('/v1/chat/completions'));
  assert.equal(posts.length, 1, `one chat request: ${JSON.stringify(requests.map((r) => r.url))}`);
  const body = JSON.parse(posts[0].body);
  assert.equal(body.stream, true, 'the page streams');
  assert.ok(body.messages.at(-1).role === 'user' && body.messages.at(-1).content === q, 'it sends the question');
  // It grew as it came: two different lengths seen, or (a fast answer) at
  // least the answer came as an event stream.
  assert.ok(lengths.size >= 2 || /text\/event-stream/.test(types[0] ?? ''), `the content grew (lengths seen: ${[...lengths]}; ${types})`);
  console.log(`chat page: ${lengths.size} content lengths seen while streaming, up to ${Math.max(...lengths)}`);
  await page.screenshot({ path: path.join(WORK, 'chat_page.png'), fullPage: true });
  // A second turn carries the first.
  await ask(page, 'And another one.');
  const posts2 = requests.filter((r) => r.method === 'POST' && r.url.endsWith('/v1/chat/completions'));
  const body2 = JSON.parse(posts2.at(-1).body);
  assert.ok(body2.messages.length >= 3 && body2.messages.some((m) => m.role === 'assistant'), 'the second turn sends the conversation');
  assert.deepEqual(errors, [], 'no script errors');
  await page.close();
});

test('with #thinking checked the reasoning fills apart from the content', { timeout: 200e3 }, async () => {
  const { page, requests, errors } = await openPage();
  await page.check('input#thinking');
  // The stream's bytes as the server sent them (fetched through the route,
  // so the page gets them whole: this test checks the split, not the timing).
  const bodies = [];
  await page.route('**/v1/chat/completions', async (route) => {
    const response = await route.fetch({ timeout: 120e3 });
    bodies.push(await response.body());
    await route.fulfill({ response });
  });
  const { content, reasoning, msg } = await ask(page, 'Think about why the sky is blue.', { part: '.reasoning' });
  const post = requests.filter((r) => r.method === 'POST' && r.url.endsWith('/v1/chat/completions')).at(-1);
  const body = JSON.parse(post.body);
  assert.deepEqual(body.thinking, { type: 'enabled' }, 'the page asks for thinking');
  assert.equal(await msg.locator('.reasoning').count(), 1, 'a .reasoning part');
  assert.ok(reasoning.trim().length > 0, 'the reasoning is filled');
  // The page shows what the stream said: its reasoning_content deltas in
  // .reasoning, its content deltas in .content (whitespace aside).
  const sse = bodies.at(-1).toString('utf8');
  let sr = '', sc = '';
  for (const line of sse.split('\n')) {
    if (!line.startsWith('data:') || line.includes('[DONE]')) continue;
    const d = JSON.parse(line.slice(5)).choices?.[0]?.delta ?? {};
    sr += d.reasoning_content ?? '';
    sc += d.content ?? '';
  }
  const norm = (t) => t.replace(/\s+/g, ' ').trim();
  assert.ok(norm(sr).length > 0, 'the stream had reasoning');
  assert.ok(norm(reasoning) === norm(sr), `the .reasoning part holds the reasoning_content:\n${norm(reasoning).slice(0, 300)}\n${norm(sr).slice(0, 300)}`);
  assert.ok(norm(content) === norm(sc), `the .content part holds the content:\n${norm(content).slice(0, 300)}\n${norm(sc).slice(0, 300)}`);
  await page.screenshot({ path: path.join(WORK, 'chat_page_thinking.png'), fullPage: true });
  assert.deepEqual(errors, [], 'no script errors');
  await page.close();
});

// A page served from another origin (a node http server on another port)
// calls the API from the browser: allowed when --cors-origin names its
// origin (the preflight with the key's header passes, an error is readable),
// refused by the browser when the server has no --cors-origin.
test('a page from another origin calls the API with --cors-origin, and the browser refuses it without', async () => {
  const http = await import('node:http');
  const app = http.createServer((req, res) => { res.writeHead(200, { 'content-type': 'text/html' }); res.end('<!doctype html><title>app</title>'); });
  await new Promise((resolve) => app.listen(0, '127.0.0.1', resolve));
  const origin = `http://127.0.0.1:${app.address().port}`;
  const api = await startServer(['--cors-origin', origin, '--api-key', 'k']);
  const page = await browser.newPage();
  try {
    await page.goto(origin + '/');
    const call = (url, key) => page.evaluate(async ({ url, key }) => {
      try {
        const r = await fetch(url + '/v1/chat/completions', {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...(key ? { authorization: 'Bearer ' + key } : {}) },
          body: JSON.stringify({ model: 'default', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
        });
        return { status: r.status, body: await r.json() };
      } catch (e) {
        return { failed: String(e) };
      }
    }, { url, key });
    const ok = await call(api.url, 'k');
    assert.equal(ok.status, 200, JSON.stringify(ok));
    assert.equal(ok.body.object, 'chat.completion');
    const wrongKey = await call(api.url, 'wrong');
    assert.equal(wrongKey.status, 401, JSON.stringify(wrongKey));
    assert.equal(wrongKey.body.error.code, 'invalid_api_key');
    const refused = await call(s.url, null);
    assert.ok(refused.failed, `the browser let a page from ${origin} read ${s.url}: ${JSON.stringify(refused)}`);
  } finally {
    await page.close();
    await api.stop();
    app.close();
  }
});
