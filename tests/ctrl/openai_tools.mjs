// SPDX-License-Identifier: Apache-2.0
// The official `openai` npm client's tool-calling requests against a
// kvferry-ctrld serving a Qwen 2.5 chat template (--chat-template): tools,
// and a history of an assistant's tool call and its result, are taken as
// the client sends them; what cannot be done is refused through it.
//   node openai_tools.mjs BASE_URL MODEL REFERENCE_DIR
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const [base, model, refdir] = process.argv.slice(2);
const require = createRequire(refdir + '/package.json');
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0 });

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const history = [
  { role: 'user', content: 'Weather in Paris?' },
  { role: 'assistant', content: null,
    tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
  { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
];

let failed = 0;
async function check(name, fn) {
  try { await fn(); console.log('ok    ' + name); } catch (e) { failed++; console.log('FAIL  ' + name + '\n      ' + e); }
}

await check('tools and a tool-call history go through the client; the answer is a chat completion', async () => {
  const tok = await (await fetch(base + '/tokenize', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: history.slice(0, 1) }) })).json();
  const r = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 4, temperature: 0 });
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), c.finish_reason);
  assert.ok(c.finish_reason === 'tool_calls' ? c.message.tool_calls.length > 0 : typeof c.message.content === 'string');
  // the tools and the call are in the prompt: far longer than the question alone
  assert.ok(r.usage.prompt_tokens > tok.count + 50, `${r.usage.prompt_tokens} prompt tokens`);
  const s = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 4, temperature: 0,
    stream: true });
  let n = 0;
  for await (const ch of s) n += ch.choices.length;
  assert.ok(n >= 1);
});

await check('tool_choice "required" and malformed call arguments are refused through the client', async () => {
  await assert.rejects(client.chat.completions.create({ model, messages: history, tools, tool_choice: 'required' }),
    (e) => e.status === 400 && e.param === 'tool_choice');
  const bad = structuredClone(history);
  bad[1].tool_calls[0].function.arguments = '{"city":';
  await assert.rejects(client.chat.completions.create({ model, messages: bad, tools }),
    (e) => e.status === 400 && e.param === 'messages');
});

process.exit(failed ? 1 : 0);
