// SPDX-License-Identifier: Apache-2.0
// The official `openai` npm client against a running kvferry-ctrld.
//   node openai_client.mjs BASE_URL MODEL REFERENCE_DIR
// Exits 0 when every check passes; prints what differed otherwise.
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const [base, model, refdir] = process.argv.slice(2);
const require = createRequire(refdir + '/package.json');
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0 });

async function post(path, body) {
  const r = await fetch(base + path, { method: 'POST', body: JSON.stringify(body),
    headers: { 'content-type': 'application/json' } });
  return { status: r.status, json: await r.json() };
}

const checks = [];
function check(name, fn) { checks.push([name, fn]); }

check('a completion has text, a finish reason and usage that matches /tokenize', async () => {
  const prompt = 'Hello there, tiny model';
  const r = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
  const c = r.choices[0];
  assert.equal(r.object, 'text_completion');
  assert.ok(['length', 'stop'].includes(c.finish_reason), c.finish_reason);
  const tok = await post('/tokenize', { model, prompt });
  assert.equal(r.usage.prompt_tokens, tok.json.count);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 24);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  if (c.finish_reason === 'length') {
    assert.equal(r.usage.completion_tokens, 24);
    assert.ok(c.text.length > 0, 'a length-finished completion has text');
  }
  // Greedy is deterministic: the same request gives the same text.
  const again = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
  assert.equal(again.choices[0].text, c.text);
});

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name a colour.' }];
let chatText = null, chatFinish = null, chatUsage = null;

check('a chat completion answers as the assistant with consistent usage', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0 });
  const c = r.choices[0];
  assert.equal(r.object, 'chat.completion');
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  const tok = await post('/tokenize', { model, messages });
  assert.equal(r.usage.prompt_tokens, tok.json.count);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 20);
  chatText = c.message.content; chatFinish = c.finish_reason; chatUsage = r.usage;
});

check('a streamed chat completion gives the same text as the unstreamed one', async () => {
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    assert.equal(ch.object, 'chat.completion.chunk');
    if (ch.usage) usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta && c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.ok(chunks >= 3, `only ${chunks} chunks`);
  assert.equal(text, chatText);
  assert.equal(finish, chatFinish);
  assert.deepEqual(usage, chatUsage);
});

check('a streamed completion with a stop string never shows the stop string', async () => {
  const full = (await client.completions.create({ model, prompt: 'abc', max_tokens: 30, temperature: 0 })).choices[0].text;
  if (full.length < 6) return; // too short to cut
  const stop = full.slice(3, 5);
  const cut = full.slice(0, full.indexOf(stop));
  const stream = await client.completions.create({ model, prompt: 'abc', max_tokens: 30, temperature: 0, stop, stream: true });
  let text = '', finish = null;
  for await (const ch of stream) { text += ch.choices[0].text; finish = ch.choices[0].finish_reason || finish; }
  assert.equal(text, cut);
  assert.equal(finish, 'stop');
});

check('models lists the served model', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);
});

check('bad requests get the right 4xx through the client', async () => {
  await assert.rejects(client.completions.create({ model: 'no-such-model', prompt: 'x' }),
    (e) => e.status === 404 && e.code === 'model_not_found');
  await assert.rejects(client.chat.completions.create({ model, messages, n: 2 }),
    (e) => e.status === 400 && e.param === 'n');
  await assert.rejects(client.completions.create({ model, prompt: 'x', max_tokens: 10 ** 7 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
  const bad = await fetch(base + '/v1/completions', { method: 'POST', body: '{"model":', headers: { 'content-type': 'application/json' } });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.code, 'invalid_json');
});

let failed = 0;
for (const [name, fn] of checks) {
  try { await fn(); console.log(`ok    ${name}`); }
  catch (e) { failed++; console.log(`FAIL  ${name}\n      ${e && e.stack ? e.stack : e}`); }
}
process.exit(failed ? 1 : 0);
