// openai_client.mjs - the official `openai` npm client against a live
// `vllm serve` (tiny_chat, CPU): models, completions and chat, streamed and
// not, usage, stop strings and stop token ids, seeds, logprobs, and errors,
// which the client must raise as APIError with the right status. Exits 77
// (skipped) when the client is not installed or the build has no tokenizer.
// usage: node openai_client.mjs VLLM_BINARY MODEL_DIR
import { check, requireOpenAI, startServer as spawnServer, stopServer, summary, tally } from './serve_proc.mjs';

const OpenAI = requireOpenAI();
const [vllm, model] = process.argv.slice(2);
const KEY = 'test-key-123', NAME = 'tiny-chat', MAX_LEN = 512;


// ------------------------------------------------------------- server --
const startServer = () => spawnServer(vllm, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
  '--api-key', KEY, '--served-model-name', NAME, '--max-model-len', String(MAX_LEN), '--max-body-bytes', '100000']);


// ------------------------------------------------------------- helpers --
async function expectError(what, status, fn, messageHas) {
  try {
    await fn();
    check(false, `${what}: no error raised (want ${status})`);
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${what}: ${e.constructor.name} is not an APIError (${e.message})`);
    check(e.status === status, `${what}: status ${e.status}, want ${status}`);
    if (messageHas) check(String(e.message).includes(messageHas), `${what}: message "${e.message}" lacks "${messageHas}"`);
  }
}

async function collect(stream, chat) {
  let text = '', finish = [], usage = null, role = null, chunks = 0, ids = [];
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (chat) {
        if (ch.delta.role) role = ch.delta.role;
        text += ch.delta.content ?? '';
      } else {
        text += ch.text;
      }
      if (ch.token_ids) ids.push(...ch.token_ids);
      if (ch.finish_reason) finish.push(ch.finish_reason);
    }
  }
  return { text, finish, usage, role, chunks, ids };
}

// A stop string that occurs in text after its first character: the first
// printable ASCII character found there.
function pickStop(text) {
  for (let i = 1; i < text.length; i++) if (/[!-~]/.test(text[i])) return text[i];
  return null;
}

// ---------------------------------------------------------------- tests --
async function testCompletions(client) {
  const base = { model: NAME, prompt: 'Hello, world', max_tokens: 24, temperature: 0, ignore_eos: true };
  const r = await client.completions.create(base);
  check(r.object === 'text_completion' && r.id.startsWith('cmpl-') && r.model === NAME, 'completion shape');
  check(typeof r.created === 'number', 'completion created');
  check(typeof r.choices[0].text === 'string', 'completion text');
  check(r.choices[0].finish_reason === 'length', `completion finish ${r.choices[0].finish_reason}`);
  check(r.usage.prompt_tokens === 13 && r.usage.completion_tokens === 24 && r.usage.total_tokens === 37,
        `completion usage ${JSON.stringify(r.usage)}`);
  const s = await collect(await client.completions.create({ ...base, stream: true, stream_options: { include_usage: true } }));
  check(s.text === r.choices[0].text, 'streamed text equals the non-streamed text');
  check(s.finish.length === 1 && s.finish[0] === 'length', `streamed finish ${s.finish}`);
  check(s.usage && s.usage.completion_tokens === 24 && s.usage.prompt_tokens === 13, 'streamed usage');
  const s2 = await collect(await client.completions.create({ ...base, stream: true }));
  check(s2.usage === null && s2.text === r.choices[0].text, 'no usage chunk unless asked');
  return r.choices[0].text;
}

async function testChat(client) {
  const base = { model: NAME, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say something' }],
                 max_tokens: 16, temperature: 0, ignore_eos: true };
  const r = await client.chat.completions.create(base);
  check(r.object === 'chat.completion' && r.id.startsWith('chatcmpl-'), 'chat shape');
  const msg = r.choices[0].message;
  check(msg.role === 'assistant' && typeof msg.content === 'string', 'chat message');
  check(r.choices[0].finish_reason === 'length' && r.usage.completion_tokens === 16, 'chat finish and usage');
  const s = await collect(await client.chat.completions.create({ ...base, stream: true, stream_options: { include_usage: true } }), true);
  check(s.role === 'assistant', 'the first chat chunk carries the role');
  check(s.text === msg.content, 'streamed chat content equals the non-streamed content');
  check(s.finish.length === 1 && s.finish[0] === 'length', `streamed chat finish ${s.finish}`);
  check(s.usage && s.usage.completion_tokens === 16 && s.usage.prompt_tokens === r.usage.prompt_tokens, 'streamed chat usage');
  // max_completion_tokens is the newer name of max_tokens
  const { max_tokens, ...rest } = base;
  const r2 = await client.chat.completions.create({ ...rest, max_completion_tokens: 5 });
  check(r2.usage.completion_tokens === 5 && max_tokens === 16, 'max_completion_tokens');
  return msg.content;
}

async function testStops(client, text, chatText) {
  let compared = 0;
  const stop = pickStop(text);
  if (stop) {
    const want = text.slice(0, text.indexOf(stop));
    const base = { model: NAME, prompt: 'Hello, world', max_tokens: 24, temperature: 0, ignore_eos: true, stop: [stop] };
    const r = await client.completions.create(base);
    check(r.choices[0].text === want, `stop ${JSON.stringify(stop)}: ${JSON.stringify(r.choices[0].text)}, want ${JSON.stringify(want)}`);
    check(r.choices[0].finish_reason === 'stop', 'a stop string finishes with "stop"');
    const s = await collect(await client.completions.create({ ...base, stop, stream: true }));
    check(s.text === want && s.finish[0] === 'stop', 'a streamed stop string (given as a string)');
    const inc = await client.completions.create({ ...base, include_stop_str_in_output: true });
    check(inc.choices[0].text === want + stop, 'include_stop_str_in_output');
    compared++;
  }
  const cstop = pickStop(chatText);
  if (cstop) {
    const want = chatText.slice(0, chatText.indexOf(cstop));
    const r = await client.chat.completions.create({
      model: NAME, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say something' }],
      max_tokens: 16, temperature: 0, ignore_eos: true, stop: cstop });
    check(r.choices[0].message.content === want && r.choices[0].finish_reason === 'stop', 'chat stop string');
    compared++;
  }
  // stop_token_ids: the output ends at the first one, which it includes.
  const full = await client.completions.create({ model: NAME, prompt: 'Hello, world', max_tokens: 24, temperature: 0,
                                                 ignore_eos: true, return_token_ids: true });
  const ids = full.choices[0].token_ids;
  check(Array.isArray(ids) && ids.length === 24, 'return_token_ids');
  const k = 5, at = ids.indexOf(ids[k]);
  const r = await client.completions.create({ model: NAME, prompt: 'Hello, world', max_tokens: 24, temperature: 0,
                                              ignore_eos: true, return_token_ids: true, stop_token_ids: [ids[k]] });
  check(JSON.stringify(r.choices[0].token_ids) === JSON.stringify(ids.slice(0, at + 1)), 'stop_token_ids ends the output');
  check(r.choices[0].finish_reason === 'stop' && r.usage.completion_tokens === at + 1, 'stop_token_ids finish and usage');
  compared++;
  check(compared >= 2, `stop strings compared ${compared} times`);
}

async function testSampling(client) {
  const p = { model: NAME, prompt: 'Once upon a time', max_tokens: 16, temperature: 1.0, top_p: 0.9, top_k: 50,
              min_p: 0.01, presence_penalty: 0.5, frequency_penalty: 0.5, repetition_penalty: 1.1, seed: 42, ignore_eos: true };
  const a = await client.completions.create(p), b = await client.completions.create(p);
  check(a.choices[0].text === b.choices[0].text, 'the same seed gives the same text');
  check(a.usage.completion_tokens === 16, 'sampled completion length');
  const lp = await client.completions.create({ model: NAME, prompt: 'Hi', max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: 3 });
  const L = lp.choices[0].logprobs;
  check(L && L.tokens.length === 8 && L.token_logprobs.length === 8 && L.top_logprobs.length === 8 &&
        L.text_offset.length === 8, 'completion logprobs arrays');
  check(L && L.token_logprobs.every((x) => x <= 0) && L.top_logprobs.every((t) => Object.keys(t).length >= 1 &&
        Object.keys(t).length <= 4), 'completion logprob values');
  const cl = await client.chat.completions.create({ model: NAME, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6,
                                                    temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 2 });
  const C = cl.choices[0].logprobs?.content;
  check(Array.isArray(C) && C.length === 6, 'chat logprobs content');
  check(C && C.every((t) => typeof t.token === 'string' && t.logprob <= 0 && Array.isArray(t.bytes) &&
        t.top_logprobs.length === 2 && t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob), 'chat top_logprobs');
  // greedy: the sampled token is the most likely one
  check(C && C.every((t) => Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6), 'greedy picks the top logprob');
}

async function testErrors(client, port) {
  const wrongKey = new OpenAI.default({ apiKey: 'wrong', baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
  await expectError('a wrong API key', 401, () => wrongKey.completions.create({ model: NAME, prompt: 'x' }));
  await expectError('a wrong API key (models)', 401, () => wrongKey.models.list());
  await expectError('an unknown model', 404, () => client.completions.create({ model: 'nope', prompt: 'x' }), 'nope');
  await expectError('a string temperature', 400, () => client.completions.create({ model: NAME, prompt: 'x', temperature: 'hot' }));
  await expectError('a negative temperature', 400, () => client.completions.create({ model: NAME, prompt: 'x', temperature: -1 }));
  await expectError('n = 0', 400, () => client.completions.create({ model: NAME, prompt: 'x', n: 0 }));
  await expectError('over max_model_len', 400,
                    () => client.completions.create({ model: NAME, prompt: 'Hello', max_tokens: 1000 }), String(MAX_LEN));
  await expectError('empty messages', 400, () => client.chat.completions.create({ model: NAME, messages: [] }));
  await expectError('a wrong method', 405, () => client.get('/completions'));
  await expectError('an unknown route', 404, () => client.get('/nothing/here'));
  await expectError('a body over --max-body-bytes', 413,
                    () => client.completions.create({ model: NAME, prompt: 'x'.repeat(200000) }));
  await expectError('a stream with bad fields', 400,
                    () => client.chat.completions.create({ model: NAME, messages: [{ role: 'user', content: 'x' }],
                                                           stream: true, top_logprobs: 3 }));
}

async function main() {
  const srv = await startServer();
  const client = new OpenAI.default({ apiKey: KEY, baseURL: `http://127.0.0.1:${srv.port}/v1`, maxRetries: 0, timeout: 60000 });
  try {
    const models = await client.models.list();
    check(models.data.length === 1 && models.data[0].id === NAME && models.data[0].object === 'model', 'models.list');
    const text = await testCompletions(client);
    const chatText = await testChat(client);
    await testStops(client, text, chatText);
    await testSampling(client);
    await testErrors(client, srv.port);
  } catch (e) {
    check(false, `unexpected error: ${e.stack}`);
  }
  const code = await stopServer(srv);
  check(code === 0, `the server exited ${code} after SIGTERM`);
  if (tally.failures) console.error(srv.log());
  process.exit(summary('server_openai'));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
