// openai_n.mjs - several choices per request through the official `openai`
// npm client against a live `vllm serve` (tiny_chat, CPU): `n` samples on
// /v1/completions and /v1/chat/completions (seeded: sample j differs from
// sample 0 and is reproducible, and sample 0 is the n = 1 answer), lists of
// prompts (text and token ids; choice index prompt * n + sample), streams
// whose choices interleave with a finish chunk each, best_of as vLLM V1
// treats it, the 400s naming `n` / `best_of`, the prompt's prefill shared
// through the prefix cache, and a streaming client that leaves aborting
// every sample. Exits 77 (skipped) when the client is not installed.
// usage: node openai_n.mjs VLLM_BINARY MODEL_DIR
import { check, requireOpenAI, startServer, stopServer, summary, tally } from './serve_proc.mjs';

const OpenAI = requireOpenAI();
const [vllm, model] = process.argv.slice(2);
const KEY = 'test-key-n', NAME = 'tiny-chat';


async function expectError(what, param, fn) {
  try {
    await fn();
    check(false, `${what}: no error raised (want a 400 naming ${param})`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === 400, `${what}: ${e.status} ${e.message}, want a 400`);
    check(e.param === param, `${what}: param ${e.param}, want ${param} (${e.message})`);
  }
}

const sorted = (a) => [...a].sort((x, y) => x - y);
const indices = (r) => r.choices.map((c) => c.index);
const chatText = (c) => c.message.content;

// A series' value; label: a substring its labels must hold.
async function metric(port, name, label = '') {
  const r = await fetch(`http://127.0.0.1:${port}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } });
  const body = await r.text();
  const m = body.match(new RegExp(`^${name}\\{[^}]*${label}[^}]*\\} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

// ---------------------------------------------------------------- tests --
async function testCompletionsN(client) {
  const base = { model: NAME, prompt: 'Hello, world', max_tokens: 8, temperature: 1.0, seed: 7, ignore_eos: true };
  const one = await client.completions.create(base);
  const r = await client.completions.create({ ...base, n: 3 });
  check(r.choices.length === 3, `n=3: ${r.choices.length} choices`);
  check(JSON.stringify(indices(r)) === '[0,1,2]', `n=3: indices ${indices(r)}`);
  check(r.choices[0].text === one.choices[0].text, `n=3: sample 0 "${r.choices[0].text}" is not the n=1 answer "${one.choices[0].text}"`);
  check(r.choices[1].text !== r.choices[0].text && r.choices[2].text !== r.choices[0].text,
        `n=3 with a seed: samples 1 and 2 differ from sample 0 (${JSON.stringify(r.choices.map((c) => c.text))})`);
  check(r.choices.every((c) => c.finish_reason === 'length'), 'n=3: every finish_reason is length');
  check(r.usage.completion_tokens === 24, `n=3: usage.completion_tokens ${r.usage.completion_tokens}, want 24`);
  check(r.usage.prompt_tokens === one.usage.prompt_tokens, `n=3: prompt_tokens ${r.usage.prompt_tokens} counts the prompt once`);
  const again = await client.completions.create({ ...base, n: 3 });
  check(JSON.stringify(again.choices.map((c) => c.text)) === JSON.stringify(r.choices.map((c) => c.text)),
        'n=3 with a seed is reproducible');
  return r;
}

async function testChatN(client) {
  const base = { model: NAME, messages: [{ role: 'user', content: 'Say something' }], max_tokens: 8, temperature: 1.0,
                 seed: 11, ignore_eos: true };
  const one = await client.chat.completions.create(base);
  const r = await client.chat.completions.create({ ...base, n: 3 });
  check(JSON.stringify(indices(r)) === '[0,1,2]', `chat n=3: indices ${indices(r)}`);
  check(chatText(r.choices[0]) === chatText(one.choices[0]), 'chat n=3: sample 0 is the n=1 answer');
  check(chatText(r.choices[1]) !== chatText(r.choices[0]) && chatText(r.choices[2]) !== chatText(r.choices[0]),
        `chat n=3: samples differ (${JSON.stringify(r.choices.map(chatText))})`);
  check(r.choices.every((c) => c.message.role === 'assistant'), 'chat n=3: every message is the assistant\'s');
  check(r.usage.completion_tokens === 24, `chat n=3: completion_tokens ${r.usage.completion_tokens}`);
  return r;
}

async function testBestOf(client) {
  const base = { model: NAME, prompt: 'Hello', max_tokens: 4 };
  const r = await client.completions.create({ ...base, best_of: 1 });
  check(r.choices.length === 1, 'best_of=1 is accepted');
  const r2 = await client.completions.create({ ...base, n: 1, best_of: null });
  check(r2.choices.length === 1, 'best_of=null is accepted');
  // vLLM V1 rejects best_of > 1 ("vLLM V1 does not yet support best_of"), and best_of < n
  await expectError('best_of=2', 'best_of', () => client.completions.create({ ...base, best_of: 2 }));
  await expectError('best_of=3 with n=3', 'best_of', () => client.completions.create({ ...base, n: 3, best_of: 3 }));
  await expectError('best_of=1 with n=2', 'best_of', () => client.completions.create({ ...base, n: 2, best_of: 1 }));
}

async function testListPrompts(client) {
  const base = { model: NAME, max_tokens: 6, temperature: 1.0, seed: 5, ignore_eos: true };
  const a = await client.completions.create({ ...base, prompt: 'Hello' });
  const b = await client.completions.create({ ...base, prompt: 'The sky is' });
  const r = await client.completions.create({ ...base, prompt: ['Hello', 'The sky is'], n: 2 });
  check(JSON.stringify(indices(r)) === '[0,1,2,3]', `2 prompts x n=2: indices ${indices(r)}`);
  check(r.choices[0].text === a.choices[0].text, 'prompt 0 sample 0 (index 0) is prompt 0\'s n=1 answer');
  check(r.choices[2].text === b.choices[0].text, 'prompt 1 sample 0 (index 2) is prompt 1\'s n=1 answer');
  check(r.usage.prompt_tokens === a.usage.prompt_tokens + b.usage.prompt_tokens,
        `2 prompts: prompt_tokens ${r.usage.prompt_tokens} = ${a.usage.prompt_tokens} + ${b.usage.prompt_tokens}`);
  check(r.usage.completion_tokens === 24, `2 prompts x n=2: completion_tokens ${r.usage.completion_tokens}`);
  const ids = await client.completions.create({ ...base, prompt: [[72, 73, 74], [75, 76]], return_token_ids: true });
  check(JSON.stringify(indices(ids)) === '[0,1]', `2 id prompts: indices ${indices(ids)}`);
  check(ids.usage.prompt_tokens === 5, `2 id prompts: prompt_tokens ${ids.usage.prompt_tokens}`);
  check(JSON.stringify(ids.choices[1].prompt_token_ids) === '[75,76]', 'id prompt 1: its prompt_token_ids');
  const echo = await client.completions.create({ ...base, prompt: ['Hello', 'The sky is'], echo: true, max_tokens: 1 });
  check(echo.choices[0].text.startsWith('Hello') && echo.choices[1].text.startsWith('The sky is'), 'echo: each prompt its own');
  await expectError('a list mixing text and ids', 'prompt', () => client.completions.create({ ...base, prompt: ['Hello', [72]] }));
  await expectError('an empty id list in the list', 'prompt', () => client.completions.create({ ...base, prompt: [[72], []] }));
}

// Streams a request: per index the text, finish reasons and chunk count; the
// order the indices came in; the usage.
async function collect(stream, chat) {
  const text = {}, finish = {}, order = [];
  let usage = null, roles = {};
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      order.push(ch.index);
      const t = chat ? (ch.delta.content ?? '') : ch.text;
      text[ch.index] = (text[ch.index] ?? '') + t;
      if (chat && ch.delta.role) roles[ch.index] = ch.delta.role;
      if (ch.finish_reason) (finish[ch.index] ??= []).push(ch.finish_reason);
    }
  }
  return { text, finish, order, usage, roles };
}

async function testStream(client, plain, chatPlain) {
  const base = { model: NAME, prompt: 'Hello, world', max_tokens: 8, temperature: 1.0, seed: 7, ignore_eos: true };
  const s = await collect(await client.completions.create({ ...base, n: 3, stream: true,
                                                           stream_options: { include_usage: true } }), false);
  check(JSON.stringify(sorted(Object.keys(s.text).map(Number))) === '[0,1,2]', `stream n=3: indices ${Object.keys(s.text)}`);
  for (let i = 0; i < 3; i++) {
    check(s.text[i] === plain.choices[i].text, `stream n=3: choice ${i} "${s.text[i]}" = the non-streamed "${plain.choices[i].text}"`);
    check(JSON.stringify(s.finish[i]) === '["length"]', `stream n=3: choice ${i} has one finish chunk (${s.finish[i]})`);
  }
  check(s.usage && s.usage.completion_tokens === 24, `stream n=3: usage ${JSON.stringify(s.usage)}`);
  // long enough that the chunks cannot all coalesce: each choice streams as its tokens come
  const long = await collect(await client.completions.create({ ...base, n: 3, max_tokens: 300, stream: true }), false);
  const last0 = long.order.lastIndexOf(0), first1 = long.order.indexOf(1), first2 = long.order.indexOf(2);
  check(first1 >= 0 && first2 >= 0 && Math.max(first1, first2) < last0,
        `stream n=3: the choices interleave (${long.order.length} chunks, index 0's last at ${last0}, 1's first at ${first1})`);
  check([0, 1, 2].every((i) => JSON.stringify(long.finish[i]) === '["length"]'), 'stream n=3 long: one finish chunk each');

  const lp = await collect(await client.completions.create({ ...base, prompt: ['Hello', 'The sky is'], n: 2, stream: true }), false);
  check(JSON.stringify(sorted(Object.keys(lp.text).map(Number))) === '[0,1,2,3]', `stream 2 prompts x 2: indices ${Object.keys(lp.text)}`);
  check([0, 1, 2, 3].every((i) => lp.finish[i] && lp.finish[i].length === 1), 'stream 2 prompts x 2: a finish chunk each');

  const c = await collect(await client.chat.completions.create({
    model: NAME, messages: [{ role: 'user', content: 'Say something' }], max_tokens: 8, temperature: 1.0, seed: 11,
    ignore_eos: true, n: 3, stream: true }), true);
  for (let i = 0; i < 3; i++) {
    check(c.roles[i] === 'assistant', `chat stream n=3: choice ${i} gets the role chunk`);
    check(c.text[i] === chatText(chatPlain.choices[i]), `chat stream n=3: choice ${i} = the non-streamed`);
    check(JSON.stringify(c.finish[i]) === '["length"]', `chat stream n=3: choice ${i} has one finish chunk`);
  }
}

// Streamed tool calls through the parsers: each choice parses its own
// text (its own parser state), and adds up to the non-streamed call.
async function testToolsN(client) {
  const tools = [{ type: 'function', function: { name: 'add', parameters: { type: 'object',
    properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'], additionalProperties: false } } }];
  const body = { model: NAME, messages: [{ role: 'user', content: 'Add.' }], tools, temperature: 1.0,
                 seed: 4, n: 3, tool_choice: { type: 'function', function: { name: 'add' } } };
  const r = await client.chat.completions.create(body);
  const args = {}, finish = {};
  for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
    for (const ch of c.choices) {
      for (const t of ch.delta.tool_calls ?? []) args[ch.index] = (args[ch.index] ?? '') + (t.function?.arguments ?? '');
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  for (let i = 0; i < 3; i++) {
    const calls = r.choices[i].message.tool_calls ?? [];
    let ok = calls.length === 1;
    try { ok = ok && typeof JSON.parse(calls[0].function.arguments).a === 'number'; } catch { ok = false; }
    check(ok, `tools n=3: choice ${i} calls add (${JSON.stringify(calls)})`);
    check(ok && args[i] === calls[0].function.arguments, `tools n=3 streamed: choice ${i} arguments ${args[i]} = ${calls[0]?.function.arguments}`);
    check(finish[i] === r.choices[i].finish_reason, `tools n=3 streamed: choice ${i} finish ${finish[i]}`);
  }
  const ids = new Set(r.choices.map((c) => c.message.tool_calls?.[0]?.id));
  check(ids.size === 3, `tools n=3: each choice's call has its own id (${[...ids]})`);
}

async function testLimits(client) {
  const base = { model: NAME, prompt: 'Hello', max_tokens: 2 };
  await expectError('n=0', 'n', () => client.completions.create({ ...base, n: 0 }));
  await expectError('n=-1', 'n', () => client.completions.create({ ...base, n: -1 }));
  await expectError('n=129', 'n', () => client.completions.create({ ...base, n: 129 }));
  await expectError('n="2"', 'n', () => client.completions.create({ ...base, n: '2' }));
  await expectError('n=1.5', 'n', () => client.completions.create({ ...base, n: 1.5 }));
  await expectError('chat n=0', 'n', () => client.chat.completions.create({ model: NAME, messages: [{ role: 'user', content: 'x' }], n: 0 }));
  await expectError('chat n=129 streamed', 'n', () => client.chat.completions.create({
    model: NAME, messages: [{ role: 'user', content: 'x' }], n: 129, stream: true }));
  await expectError('513 prompts x n=2', 'n', () => client.completions.create({ ...base, prompt: Array(513).fill('x'), n: 2 }));
  await expectError('1025 prompts', 'prompt', () => client.completions.create({ ...base, prompt: Array(1025).fill('x') }));
  const r = await client.completions.create({ ...base, n: 128, max_tokens: 1 });
  check(r.choices.length === 128, `n=128 (the cap) gives 128 choices, got ${r.choices.length}`);
}

// The samples of one prompt share its prefill: samples 1.. find its blocks
// in the prefix cache.
async function testSharedPrefill(client, port) {
  const prompt = 'A prompt long enough to fill several blocks of the cache: one two three four five six seven eight nine ten';
  const before = await metric(port, 'vllm:prefix_cache_hits_total');
  const r = await client.completions.create({ model: NAME, prompt, n: 4, max_tokens: 2, temperature: 1.0 });
  const after = await metric(port, 'vllm:prefix_cache_hits_total');
  const bs = 16;
  check(after - before >= 3 * bs, `n=4 on a ${r.usage.prompt_tokens}-token prompt: ${after - before} prefix-cache hits, want >= ${3 * bs}`);
}

// Per-request metrics: each sample is a finished request of its own; each
// prompt's longest sample goes once into max_num_generation_tokens (vLLM
// submits each prompt of a list as a request of n samples).
async function testMetrics(client, port) {
  const names = ['vllm:request_max_num_generation_tokens_count', 'vllm:request_max_num_generation_tokens_sum',
                 'vllm:request_generation_tokens_count', 'vllm:request_generation_tokens_sum'];
  const get = async () => Promise.all(names.map((n) => metric(port, n)));
  const before = await get();
  await client.completions.create({ model: NAME, prompt: ['Hello', 'Hi'], n: 3, max_tokens: 5, ignore_eos: true, temperature: 1.0 });
  const after = await get(), d = after.map((x, i) => x - before[i]);
  check(d[0] === 2 && d[1] === 10, `max_num_generation_tokens: +${d[0]} observations of sum ${d[1]}, want 2 of 10`);
  check(d[2] === 6 && d[3] === 30, `request_generation_tokens: +${d[2]} observations of sum ${d[3]}, want 6 of 30`);
}

async function testDisconnect(client, port) {
  const abort = 'finished_reason="abort"';
  const before = await metric(port, 'vllm:request_success_total', abort);
  const ac = new AbortController();
  const stream = await client.completions.create({ model: NAME, prompt: 'Hello', n: 4, max_tokens: 400, ignore_eos: true,
                                                   temperature: 1.0, stream: true }, { signal: ac.signal });
  let seen = 0;
  try {
    for await (const c of stream) {
      if (c.choices.length && ++seen === 6) ac.abort();
    }
  } catch (e) {
    // the abort
  }
  let running = 1;
  for (let i = 0; i < 100 && running; i++) {
    await new Promise((r) => setTimeout(r, 50));
    running = await metric(port, 'vllm:num_requests_running');
  }
  check(running === 0, `a streaming client that left: ${running} requests still running`);
  const after = await metric(port, 'vllm:request_success_total', abort);
  check(after - before === 4, `a streaming client that left: ${after - before} samples aborted, want 4`);
}

async function main() {
  const srv = await startServer(vllm, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
    '--api-key', KEY, '--served-model-name', NAME, '--max-model-len', '512', '--max-num-seqs', '16']);
  const client = new OpenAI.default({ apiKey: KEY, baseURL: `http://127.0.0.1:${srv.port}/v1`, maxRetries: 0, timeout: 60000 });
  try {
    const plain = await testCompletionsN(client);
    const chatPlain = await testChatN(client);
    await testBestOf(client);
    await testListPrompts(client);
    await testStream(client, plain, chatPlain);
    await testToolsN(client);
    await testLimits(client);
    await testSharedPrefill(client, srv.port);
    await testMetrics(client, srv.port);
    await testDisconnect(client, srv.port);
  } catch (e) {
    check(false, `unexpected error: ${e.stack}`);
  }
  const code = await stopServer(srv);
  check(code === 0, `the server exited ${code} after SIGTERM`);
  if (tally.failures) console.error(srv.log().slice(-4000));
  process.exit(summary('server_openai_n'));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
