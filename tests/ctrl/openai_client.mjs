// SPDX-License-Identifier: Apache-2.0
// The official `openai` npm client against a running kvferry-ctrld.
//   node openai_client.mjs BASE_URL MODEL REFERENCE_DIR [KVFERRY_GENERATE MODEL_DIR]
// Exits 0 when every check passes; prints what differed otherwise. With
// kvferry-generate and the model directory, logprobs are checked against the
// engine's own logits.
import { createRequire } from 'node:module';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';

const [base, model, refdir, generate, modelDir] = process.argv.slice(2);
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
  const { prompt_tokens_details: cached, ...counts } = usage;
  const { prompt_tokens_details: _first, ...chatCounts } = chatUsage;
  assert.deepEqual(counts, chatCounts);
  // the same prompt again: the prefix cache gave its whole blocks but the last position's
  assert.equal(cached.cached_tokens, Math.floor((usage.prompt_tokens - 1) / 16) * 16);
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

check('models.retrieve gives the served model, and another id a 404', async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, 'model');
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => e.status === 404 && e.code === 'model_not_found');
});

check('parameters kvferry does not implement are refused by name, and accepted at their defaults', async () => {
  for (const [k, v] of [['presence_penalty', 0.5], ['frequency_penalty', 1], ['logit_bias', { 5: 10 }],
    ['response_format', { type: 'json_object' }]])
    await assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 2, [k]: v }),
      (e) => e.status === 400 && e.param === k && e.code === 'unsupported_parameter', k);
  // this model's template (plain ChatML) renders no tools: said, not ignored
  await assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 2,
    tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }),
  (e) => e.status === 400 && e.param === 'tools' && e.code === 'unsupported_value' && /Qwen/.test(e.message));
  for (const [k, v] of [['best_of', 2], ['suffix', 'tail']])
    await assert.rejects(client.completions.create({ model, prompt: 'x', max_tokens: 2, [k]: v }),
      (e) => e.status === 400 && e.param === k && e.code === 'unsupported_parameter', k);
  const r = await client.chat.completions.create({ model, messages, max_tokens: 2, temperature: 0,
    presence_penalty: 0, frequency_penalty: 0, logit_bias: {}, response_format: { type: 'text' }, n: 1 });
  assert.equal(r.choices.length, 1);
});

check('n choices: indexed, seeded ones repeat, choice 0 is the n=1 answer, the prompt counted once', async () => {
  const req = { model, prompt: 'Once upon', max_tokens: 8, temperature: 1, seed: 11, ignore_eos: true };
  const one = await client.completions.create(req);
  const r = await client.completions.create({ ...req, n: 3 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.choices[0].text, one.choices[0].text);
  assert.ok(new Set(r.choices.map((c) => c.text)).size > 1, 'the sampled choices all equal: ' + JSON.stringify(r.choices));
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 24);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 24);
  const again = await client.completions.create({ ...req, n: 3 });
  assert.deepEqual(again.choices.map((c) => c.text), r.choices.map((c) => c.text));
  const greedy = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, n: 2 });
  assert.equal(greedy.choices.length, 2);
  assert.equal(greedy.choices[0].message.content, greedy.choices[1].message.content);
  // the later choices read the first one's computed prompt: its whole 16-token blocks
  const shared = async () => (await (await fetch(base + '/stats')).json()).backend.replicas
    .reduce((a, x) => a + x.prefill_shared_tokens_total, 0);
  const ids = Array.from({ length: 40 }, (_, i) => 3 + ((i * 37) % 200));
  // (first: a prompt the prefix cache already holds is read from it instead)
  const before = await shared();
  const four = await client.completions.create({ model, prompt: ids, max_tokens: 6, temperature: 0, n: 4 });
  assert.equal(await shared() - before, 3 * 32, 'three choices each read two blocks of the first one\'s prompt');
  const alone = await client.completions.create({ model, prompt: ids, max_tokens: 6, temperature: 0 });
  for (const c of four.choices) assert.equal(c.text, alone.choices[0].text);
  // the prefix cache: the first time nothing cached, then the prompt's two whole blocks
  assert.equal(four.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(alone.usage.prompt_tokens_details.cached_tokens, 32);
  const nat = await (await fetch(base + '/generate', { method: 'POST', body: JSON.stringify({
    input_ids: ids, sampling_params: { max_new_tokens: 2, temperature: 0 } }) })).json();
  assert.equal(nat.meta_info.cached_tokens, 32, JSON.stringify(nat.meta_info));
});

check('a list of prompts: choice p * n + j answers prompt p as it would alone, each prompt counted once', async () => {
  const prompts = ['Hello there', 'The kernel', 'abc'];
  const solo = [];
  for (const prompt of prompts) solo.push(await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0 }));
  const r = await client.completions.create({ model, prompt: prompts, max_tokens: 6, temperature: 0, n: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3, 4, 5]);
  assert.deepEqual(r.choices.map((c) => c.text), solo.flatMap((s) => [s.choices[0].text, s.choices[0].text]));
  assert.equal(r.usage.prompt_tokens, solo.reduce((a, s) => a + s.usage.prompt_tokens, 0));
  assert.equal(r.usage.completion_tokens, 2 * solo.reduce((a, s) => a + s.usage.completion_tokens, 0));
  const tok = await post('/tokenize', { model, prompt: 'abc' });
  const byIds = await client.completions.create({ model, prompt: [tok.json.tokens, 'abc'], max_tokens: 6, temperature: 0 });
  assert.equal(byIds.choices[0].text, byIds.choices[1].text);
  await assert.rejects(client.completions.create({ model, prompt: ['a', 'x'.repeat(5000)], max_tokens: 2 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded' && /prompt\[1\]/.test(e.message));
});

check('a streamed chat with n choices gives each choice the unstreamed text, one finish each, one usage', async () => {
  const req = { model, messages, max_tokens: 10, temperature: 0.9, seed: 5, n: 3 };
  const whole = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const text = ['', '', ''], finish = [null, null, null], roles = [0, 0, 0];
  let usage = null, usages = 0;
  for await (const ch of stream) {
    if (ch.usage) { usage = ch.usage; usages++; }
    for (const c of ch.choices) {
      assert.equal(finish[c.index], null, `choice ${c.index} spoke after its finish`);
      if (c.delta.role) roles[c.index]++;
      if (c.delta.content) text[c.index] += c.delta.content;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  assert.deepEqual(roles, [1, 1, 1]);
  assert.deepEqual(text, whole.choices.map((c) => c.message.content));
  assert.deepEqual(finish, whole.choices.map((c) => c.finish_reason));
  assert.equal(usages, 1);
  assert.deepEqual(usage, whole.usage);
});

check('echo: the completion\'s text starts with the prompt, as the prompt alone continues', async () => {
  const prompt = 'Hello there, tiny model';
  const plain = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0 });
  const r = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, echo: true });
  assert.equal(r.choices[0].text, prompt + plain.choices[0].text);
});

check('bad requests get the right 4xx through the client', async () => {
  await assert.rejects(client.completions.create({ model: 'no-such-model', prompt: 'x' }),
    (e) => e.status === 404 && e.code === 'model_not_found');
  await assert.rejects(client.chat.completions.create({ model, messages, n: 0 }),
    (e) => e.status === 400 && e.param === 'n' && e.code === 'invalid_value');
  await assert.rejects(client.chat.completions.create({ model, messages, n: 129 }),
    (e) => e.status === 400 && e.param === 'n' && e.code === 'invalid_value');
  await assert.rejects(client.completions.create({ model, prompt: 'x', max_tokens: 10 ** 7 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
  const bad = await fetch(base + '/v1/completions', { method: 'POST', body: '{"model":', headers: { 'content-type': 'application/json' } });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.code, 'invalid_json');
});

// The engine's log-softmax rows for a greedy run of `ids`: kvferry-generate
// gives the greedy continuation, then the logits of every position of
// prompt + continuation; row len(prompt) - 1 + j produced token j.
function engineRows(ids, n) {
  const run = (args) => execFileSync(generate, ['--model', modelDir, '--threads', '1', '--ignore-eos', ...args],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  const gen = run(['--ids', ids.join(','), '--max-tokens', String(n)]).match(/^ids: (.*)$/m)[1]
    .split(',').map(Number);
  const dir = mkdtempSync(join(tmpdir(), 'kvf-lp-'));
  try {
    run(['--ids', ids.concat(gen.slice(0, n - 1)).join(','), '--max-tokens', '0', '--logits', join(dir, 'l.f32')]);
    const buf = readFileSync(join(dir, 'l.f32'));
    const f = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
    const vocab = f.length / (ids.length + n - 1);
    const rows = [];
    for (let j = 0; j < n; j++) {
      const row = Array.from(f.subarray((ids.length - 1 + j) * vocab, (ids.length + j) * vocab));
      const mx = Math.max(...row);
      const lse = mx + Math.log(row.reduce((a, x) => a + Math.exp(x - mx), 0));
      rows.push(row.map((x) => x - lse));
    }
    return { gen, rows };
  } finally { rmSync(dir, { recursive: true, force: true }); }
}

function sortedDesc(xs) { for (let i = 1; i < xs.length; i++) if (xs[i] > xs[i - 1]) return false; return true; }

// The engine's log-softmax row at every position of `ids` (kvferry-generate's logits).
function promptRows(ids) {
  const dir = mkdtempSync(join(tmpdir(), 'kvf-plp-'));
  try {
    execFileSync(generate, ['--model', modelDir, '--threads', '1', '--ids', ids.join(','), '--max-tokens', '0',
      '--logits', join(dir, 'l.f32')], { stdio: ['ignore', 'ignore', 'ignore'] });
    const buf = readFileSync(join(dir, 'l.f32'));
    const f = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
    const vocab = f.length / ids.length;
    return ids.map((_, p) => {
      const row = Array.from(f.subarray(p * vocab, (p + 1) * vocab));
      const mx = Math.max(...row);
      const lse = mx + Math.log(row.reduce((a, x) => a + Math.exp(x - mx), 0));
      return row.map((x) => x - lse);
    });
  } finally { rmSync(dir, { recursive: true, force: true }); }
}

check('echo with logprobs (lm-eval\'s likelihood request): each prompt token\'s logprob is the engine\'s, greedy where it is the best', async () => {
  const texts = ['Logprobs of a prompt, please', 'The quick brown fox'];
  const prompts = [];
  for (const t of texts) prompts.push((await post('/tokenize', { model, prompt: t })).json.tokens);
  // what lm-eval's local-completions sends for loglikelihood
  const r = await client.completions.create({ model, prompt: prompts, max_tokens: 1, temperature: 0, echo: true, logprobs: 1 });
  assert.equal(r.choices.length, prompts.length);
  let worst = 0;
  for (const c of r.choices) {
    const ids = prompts[c.index], lp = c.logprobs, n = ids.length;
    assert.equal(lp.tokens.length, n + 1);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    assert.equal(lp.text_offset[0], 0);
    assert.ok(c.text.startsWith(texts[c.index]), c.text);
    for (let p = 1; p <= n; p++) assert.ok(lp.text_offset[p] >= lp.text_offset[p - 1]);
    const alone = await client.completions.create({ model, prompt: ids, max_tokens: 0, echo: true, logprobs: 1 });
    assert.equal(alone.choices[0].text, texts[c.index]);
    assert.equal(alone.choices[0].finish_reason, 'length');
    assert.equal(alone.usage.completion_tokens, 0);
    assert.deepEqual(alone.choices[0].logprobs.token_logprobs, lp.token_logprobs.slice(0, n));
    if (!(generate && modelDir)) continue;
    const rows = promptRows(ids);
    for (let p = 1; p < n; p++) {
      const want = rows[p - 1][ids[p]], best = Math.max(...rows[p - 1]);
      worst = Math.max(worst, Math.abs(lp.token_logprobs[p] - want));
      assert.ok(Math.abs(lp.token_logprobs[p] - want) < 1e-4, `position ${p}: ${lp.token_logprobs[p]} vs engine ${want}`);
      const top = Object.values(lp.top_logprobs[p]);
      assert.equal(top.length, 1);
      assert.ok(Math.abs(top[0] - best) < 1e-4, `position ${p}: best ${top[0]} vs engine ${best}`);
      // lm-eval's is_greedy: the token's logprob equals the best one's exactly when it is the best
      if (want === best) assert.equal(lp.token_logprobs[p], top[0]);
      else if (best - want > 1e-3) assert.ok(lp.token_logprobs[p] < top[0]);
    }
  }
  if (generate && modelDir)
    console.log(`      prompt positions against kvferry-generate's logits: worst |logprob difference| ${worst.toExponential(2)}`);
  await assert.rejects(client.completions.create({ model, prompt: 'x', max_tokens: 0 }),
    (e) => e.status === 400 && e.param === 'max_tokens');
});

check('completions logprobs: each greedy token\'s logprob is the engine\'s log-softmax, top_logprobs sorted, k respected', async () => {
  const ids = (await post('/tokenize', { model, prompt: 'Logprobs, please' })).json.tokens;
  const n = 10;
  const r = await client.completions.create({ model, prompt: ids, max_tokens: n, temperature: 0, logprobs: 5 });
  const lp = r.choices[0].logprobs;
  const m = lp.token_logprobs.length;
  assert.ok(m === r.usage.completion_tokens || (r.choices[0].finish_reason === 'stop' && m === r.usage.completion_tokens - 1),
    `${m} logprobs for ${r.usage.completion_tokens} tokens`);
  assert.equal(lp.tokens.length, m);
  assert.equal(lp.top_logprobs.length, m);
  assert.equal(lp.text_offset.length, m);
  // Whole-character tokens spell the text (a token holding part of a
  // character is written "bytes:\\xNN" instead).
  if (!lp.tokens.some((t) => t.startsWith('bytes:'))) assert.equal(lp.tokens.join(''), r.choices[0].text);
  for (let j = 0; j < m; j++) {
    const vals = Object.values(lp.top_logprobs[j]);
    assert.ok(vals.length >= 1 && vals.length <= 5, `${vals.length} alternatives`);
    // The JSON lists them best first; a JavaScript object puts integer-like
    // keys (a token whose text is "6") first, so only the others keep the order.
    const ordered = Object.entries(lp.top_logprobs[j]).filter(([k]) => !/^(0|[1-9][0-9]*)$/.test(k)).map(([, v]) => v);
    assert.ok(sortedDesc(ordered), 'top_logprobs best first');
    assert.ok(Math.abs(Math.max(...vals) - lp.token_logprobs[j]) < 1e-6, 'greedy: the token is the most likely one');
    if (j > 0) assert.ok(lp.text_offset[j] >= lp.text_offset[j - 1]);
  }
  if (generate && modelDir) {
    const { rows } = engineRows(ids, m);
    let worst = 0;
    for (let j = 0; j < m; j++) {
      const best = [...rows[j]].sort((a, b) => b - a).slice(0, 5);
      worst = Math.max(worst, Math.abs(lp.token_logprobs[j] - best[0]));
      assert.ok(Math.abs(lp.token_logprobs[j] - best[0]) < 1e-4, `token ${j}: ${lp.token_logprobs[j]} vs engine ${best[0]}`);
      const vals = Object.values(lp.top_logprobs[j]).sort((x, y) => y - x);
      for (let t = 0; t < vals.length; t++)
        assert.ok(Math.abs(vals[t] - best[t]) < 1e-4, `token ${j} alternative ${t}: ${vals[t]} vs engine ${best[t]}`);
    }
    console.log(`      ${m} tokens against kvferry-generate's logits: worst |logprob difference| ${worst.toExponential(2)}`);
  }
  const none = await client.completions.create({ model, prompt: ids, max_tokens: 3, temperature: 0 });
  assert.equal(none.choices[0].logprobs, null);
  await assert.rejects(client.completions.create({ model, prompt: 'x', logprobs: 21 }),
    (e) => e.status === 400 && e.param === 'logprobs');
});

check('chat logprobs: streamed and not, the same tokens and logprobs, top_logprobs honoured', async () => {
  const body = { model, messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 };
  const r = await client.chat.completions.create(body);
  const content = r.choices[0].logprobs.content;
  assert.ok(content.length >= 1);
  assert.equal(Buffer.concat(content.map((x) => Buffer.from(x.bytes))).toString('utf8'), r.choices[0].message.content);
  for (const x of content) {
    assert.equal(x.top_logprobs.length, 3);
    assert.ok(sortedDesc(x.top_logprobs.map((t) => t.logprob)));
    assert.equal(x.top_logprobs[0].token, x.token);
    assert.ok(Math.abs(x.top_logprobs[0].logprob - x.logprob) < 1e-6);
    assert.ok(x.logprob <= 0);
  }
  const stream = await client.chat.completions.create({ ...body, stream: true });
  const streamed = [];
  let text = '';
  for await (const ch of stream) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta && c.delta.content) text += c.delta.content;
    if (c.logprobs && c.logprobs.content) streamed.push(...c.logprobs.content);
  }
  assert.equal(text, r.choices[0].message.content);
  assert.deepEqual(streamed, content);
  const plain = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true });
  for (const x of plain.choices[0].logprobs.content) assert.equal(x.top_logprobs.length, 0);
  await assert.rejects(client.chat.completions.create({ model, messages, top_logprobs: 2 }),
    (e) => e.status === 400 && e.param === 'top_logprobs');
});

check('streamed completions logprobs add up to the unstreamed ones', async () => {
  const body = { model, prompt: 'Stream me', max_tokens: 10, temperature: 0, logprobs: 2 };
  const r = await client.completions.create(body);
  const stream = await client.completions.create({ ...body, stream: true });
  const toks = [], lps = [], offs = [];
  let text = '';
  for await (const ch of stream) {
    const c = ch.choices[0];
    text += c.text;
    if (c.logprobs) { toks.push(...c.logprobs.tokens); lps.push(...c.logprobs.token_logprobs); offs.push(...c.logprobs.text_offset); }
  }
  assert.equal(text, r.choices[0].text);
  assert.deepEqual(toks, r.choices[0].logprobs.tokens);
  assert.deepEqual(lps, r.choices[0].logprobs.token_logprobs);
  assert.deepEqual(offs, r.choices[0].logprobs.text_offset);
});

let failed = 0;
for (const [name, fn] of checks) {
  try { await fn(); console.log(`ok    ${name}`); }
  catch (e) { failed++; console.log(`FAIL  ${name}\n      ${e && e.stack ? e.stack : e}`); }
}
process.exit(failed ? 1 : 0);
