// structured_e2e.mjs - structured output, tool calls and reasoning through a
// live `vllm serve` (tiny_chat, CPU) and the official `openai` npm client.
// The tiny model's weights are random: its preferences are noise, so only
// the grammar makes an answer valid.
//   - every JSON schema of tests/fixtures/structured/schemas.jsonl (hand-
//     written and generated, $ref and nesting included) through
//     response_format json_schema, streamed and not, alternating chat and
//     completions (guided_json / structured_outputs.json): every answer is
//     validated by ajv (tools/oracle/structured/validate.mjs);
//   - regexes (guided_regex / structured_outputs.regex) checked with
//     JavaScript's RegExp, and choices;
//   - json_object; an unsupported keyword is a 400 naming it;
//   - tool_choice required / named (the tools' grammar): tool_calls whose
//     arguments validate against the tool's parameters, streamed deltas
//     that add up to the non-streamed call, finish_reason; a tool message
//     sent back renders;
//   - --reasoning-parser qwen3: reasoning_content, streamed == not.
// usage: node structured_e2e.mjs VLLM_BINARY MODEL_DIR [NUM_SCHEMAS]
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { startServer as spawnServer, stopServer } from './serve_proc.mjs';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '../..');
let OpenAI, Ajv;
try {
  OpenAI = createRequire(join(root, 'tools/oracle/server/package.json'))('openai');
  Ajv = createRequire(join(root, 'tools/oracle/structured/package.json'))('ajv/dist/2020.js');
} catch (e) {
  console.error(`SKIP: the npm test packages are not installed (scripts/install-deps.sh): ${e.message}`);
  process.exit(77);
}
const [vllm, model, numArg] = process.argv.slice(2);
function startServer(parser = 'hermes') {
  return spawnServer(vllm, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
    '--served-model-name', NAME, '--max-model-len', '4096', '--tool-call-parser', parser, '--enable-auto-tool-choice',
    '--reasoning-parser', 'qwen3']);
}
const NAME = 'tiny-chat';
const SCHEMAS = join(root, 'tests/fixtures/structured/schemas.jsonl');

let checks = 0, failures = 0;
function check(cond, what) {
  checks++;
  if (!cond) {
    failures++;
    console.error(`CHECK failed: ${what}`);
  }
}



// Runs fn over items, `width` at a time (the engine batches them).
async function pool(items, width, fn) {
  const out = new Array(items.length);
  let next = 0;
  async function worker() {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  }
  await Promise.all(Array.from({ length: width }, worker));
  return out;
}

// One request: chat or completions, streamed or not; returns the text, the
// finish reason, and for chat the message (tool_calls, reasoning_content).
// With --reasoning-parser a grammar waits for the model's </think> while
// thinking is on; these requests turn it off (think: true keeps it).
async function ask(client, chat, stream, body) {
  const { think, ...rest } = body;
  if (chat && !think && !rest.chat_template_kwargs) rest.chat_template_kwargs = { enable_thinking: false };
  body = rest;
  const base = chat ? { model: NAME, messages: [{ role: 'user', content: 'Answer.' }], ...body }
                    : { model: NAME, prompt: 'Answer:', ...body };
  const api = chat ? client.chat.completions : client.completions;
  if (!stream) {
    const r = await api.create(base);
    const c = r.choices[0];
    return { text: chat ? (c.message.content ?? '') : c.text, finish: c.finish_reason, message: c.message };
  }
  let text = '', reasoning = '', finish = null;
  const calls = [];
  for await (const ch of await api.create({ ...base, stream: true })) {
    for (const c of ch.choices) {
      if (chat) {
        text += c.delta.content ?? '';
        reasoning += c.delta.reasoning_content ?? '';
        for (const t of c.delta.tool_calls ?? []) {
          if (!calls[t.index]) calls[t.index] = { id: t.id, type: t.type, function: { name: t.function?.name, arguments: '' } };
          calls[t.index].function.arguments += t.function?.arguments ?? '';
        }
      } else {
        text += c.text;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, message: { content: text, reasoning_content: reasoning, tool_calls: calls } };
}

// ------------------------------------------------------------- schemas --
async function testSchemas(client, dir, limit) {
  const schemas = readFileSync(SCHEMAS, 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l)).slice(0, limit);
  const cases = [];
  for (let i = 0; i < schemas.length; i++) for (const stream of [false, true]) cases.push({ i, stream });
  const spell = (i, schema) => {
    switch (i % 4) {
      case 0: return { chat: true, body: { response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } } } };
      case 1: return { chat: false, body: { guided_json: schema } };
      case 2: return { chat: true, body: { structured_outputs: { json: schema } } };
      default: return { chat: false, body: { structured_outputs: { json: JSON.stringify(schema) } } };
    }
  };
  const t0 = Date.now();
  const res = await pool(cases, 32, async ({ i, stream }) => {
    const { chat, body } = spell(i, schemas[i]);
    try {
      return await ask(client, chat, stream, { ...body, max_tokens: 3000, temperature: 1, seed: i });
    } catch (e) {
      return { error: e.message };
    }
  });
  const lines = [];
  let cut = 0, errors = 0;
  res.forEach((r, k) => {
    if (r.error) return errors++, check(false, `schema ${cases[k].i}: ${r.error}`);
    if (r.finish !== 'stop') return cut++;
    lines.push(JSON.stringify({ schema: cases[k].i, text: r.text }));
  });
  const out = join(dir, 'outputs.jsonl');
  writeFileSync(out, lines.join('\n') + '\n');
  writeFileSync(join(dir, 'schemas.jsonl'), schemas.map((s) => JSON.stringify(s)).join('\n') + '\n');
  const v = spawnSync(process.execPath, [join(root, 'tools/oracle/structured/validate.mjs'), join(dir, 'schemas.jsonl'), out],
                      { encoding: 'utf8' });
  const m = /validated (\d+)/.exec(v.stdout);
  console.log(`  schemas: ${cases.length} answers in ${((Date.now() - t0) / 1000).toFixed(1)} s, ${lines.length} complete, ` +
              `${cut} cut by max_tokens; ajv: ${v.stdout.trim()} ${v.stderr.trim().slice(0, 2000)}`);
  check(v.status === 0, `ajv rejected answers: ${v.stderr.slice(0, 2000)}`);
  check(m && Number(m[1]) === lines.length && lines.length > 0, `ajv validated ${m && m[1]} of ${lines.length}`);
  // max_tokens may cut an answer (finish_reason length), never the grammar
  check(cut <= cases.length / 20, `${cut} of ${cases.length} answers cut by max_tokens`);
  check(errors === 0, `${errors} requests failed`);
}

// ------------------------------------------------------ regex, choice --
const REGEXES = [
  '[0-9]{3}-[0-9]{4}', '[a-z]+@[a-z]+\\.(com|org|net)', '(yes|no|maybe)', '\\d{4}-\\d{2}-\\d{2}', '[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?',
  '(0|[1-9][0-9]*)(\\.[0-9]{1,3})?', '#[0-9a-fA-F]{6}', '(\\+|-)?\\d{1,5}', '[a-z_][a-z0-9_]{0,15}', 'v\\d+\\.\\d+\\.\\d+',
  '(ab|cd)*ef', '[^,\\n]{1,10},[^,\\n]{1,10}', '\\w{3,6}\\s\\w{3,6}', 'https?://[a-z]{3,10}\\.[a-z]{2,3}/[a-z0-9]{0,8}',
  '(true|false)', '[01]{8}', '\\(\\d{3}\\) \\d{3}-\\d{4}', 'x{2,4}y?z+', '[aeiou]{1,3}[^aeiou\\s]{1,3}', '(?:id|ID)_\\d{2,4}',
  '[0-9a-f]{8}-[0-9a-f]{4}', '(Mon|Tue|Wed|Thu|Fri|Sat|Sun)day?', '-?(?:0|[1-9]\\d{0,2})e[+-]?\\d', '[A-Z]{2}\\d{2} ?[A-Z]{3}',
  '"[^"\\\\]{0,12}"',
];

async function testRegexChoice(client) {
  const cases = [];
  for (let k = 0; k < 4; k++) REGEXES.forEach((re, i) => cases.push({ re, i, k }));
  const res = await pool(cases, 32, async ({ re, i, k }) => {
    const body = k % 2 ? { structured_outputs: { regex: re } } : { guided_regex: re };
    return ask(client, k >= 2, k === 1 || k === 2, { ...body, max_tokens: 400, temperature: 1, seed: 100 * k + i });
  });
  let ok = 0, cut = 0;
  res.forEach((r, n) => {
    const { re } = cases[n];
    if (r.finish !== 'stop') return cut++;
    const good = new RegExp(`^(?:${re})$`, 'u').test(r.text);
    ok += good;
    check(good, `regex ${re}: ${JSON.stringify(r.text)} does not match`);
  });
  console.log(`  regexes: ${ok} of ${cases.length} match, ${cut} cut by max_tokens`);
  check(ok >= cases.length * 0.95 && cut <= 2, `regexes: ${ok} match, ${cut} cut`);
  const choices = [];
  for (let i = 0; i < 25; i++) {
    const n = 2 + (i % 5);
    choices.push(Array.from({ length: n }, (_, j) => ['red', 'green', 'blue', 'Ünïcode ✓', 'a b c', 'x', 'xy', 'xyz'][(i + j * 3) % 8] + (j > 4 ? j : '')));
  }
  const cres = await pool(choices.map((c, i) => ({ c, i })), 32, async ({ c, i }) => {
    const body = i % 2 ? { guided_choice: c } : { structured_outputs: { choice: c } };
    return ask(client, i % 3 === 0, i % 4 < 2, { ...body, max_tokens: 50, temperature: 1, seed: i });
  });
  let cok = 0;
  cres.forEach((r, i) => {
    const good = r.finish === 'stop' && choices[i].includes(r.text);
    cok += good;
    check(good, `choice ${JSON.stringify(choices[i])}: ${JSON.stringify(r.text)} (${r.finish})`);
  });
  console.log(`  choices: ${cok} of ${choices.length} are one of the choices`);
}

// ----------------------------------------------------------- json_object --
async function testJsonObjectAndErrors(client) {
  for (const stream of [false, true]) {
    const r = await ask(client, true, stream, { response_format: { type: 'json_object' }, max_tokens: 3000, seed: 7 });
    let v = null;
    try { v = JSON.parse(r.text); } catch { /* checked below */ }
    check(r.finish === 'stop' && v !== null && typeof v === 'object' && !Array.isArray(v),
          `json_object (stream ${stream}): ${r.finish} ${r.text.slice(0, 200)}`);
  }
  const bad = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', patternProperties: { a: {} } } } } }, 'patternProperties'],
    [{ guided_json: { type: 'object', not: { required: ['a'] } } }, "'not'"],
    [{ guided_regex: 'a(?=b)' }, 'guided_regex'],
    [{ guided_regex: 'a', guided_choice: ['x'] }, 'guided_choice'],
    [{ response_format: { type: 'structural_tag' } }, 'structural_tag'],
    [{ guided_choice: [] }, 'guided_choice'],
    [{ structural_tag: '{}' }, 'structural_tag'],
    [{ guided_json: { type: 'object' }, guided_whitespace_pattern: ' ' }, 'guided_whitespace_pattern'],
    [{ functions: [{ name: 'f' }] }, 'functions'],
    [{ reasoning_effort: 'max' }, 'reasoning_effort'],
    [{ allowed_token_ids: [] }, 'allowed_token_ids'],
  ];
  for (const [body, must] of bad) {
    try {
      await ask(client, true, false, { ...body, max_tokens: 5 });
      check(false, `${JSON.stringify(body)}: no error`);
    } catch (e) {
      check(e.status === 400 && String(e.message).includes(must), `${JSON.stringify(body)}: ${e.status} ${e.message}`);
    }
  }
}

// ----------------------------------------------------------------- tools --
const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] },
                                               days: { type: 'integer', minimum: 1, maximum: 14 } },
                  required: ['city', 'days'], additionalProperties: false } } },
  { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } },
                                                              required: ['a', 'b'], additionalProperties: false } } },
];

async function testTools(client) {
  const ajv = new Ajv({ strict: false });
  const validators = Object.fromEntries(TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
  const validCall = (c) => {
    let args = null;
    try { args = JSON.parse(c.function.arguments); } catch { return false; }
    return c.type === 'function' && c.id && validators[c.function.name] && validators[c.function.name](args);
  };
  let n = 0;
  for (let seed = 0; seed < 6; seed++) {
    for (const choice of ['required', { type: 'function', function: { name: 'add' } }]) {
      const body = { tools: TOOLS, tool_choice: choice, max_tokens: 1500, temperature: 1, seed, parallel_tool_calls: seed % 2 === 0 };
      const r = await ask(client, true, false, body);
      const s = await ask(client, true, true, body);
      const calls = r.message.tool_calls ?? [];
      const named = typeof choice === 'object';
      check(r.finish === (named ? 'stop' : 'tool_calls') && calls.length >= 1, `tools ${JSON.stringify(choice)} seed ${seed}: ${r.finish}, ${calls.length} calls`);
      check(calls.every(validCall), `tool calls validate: ${JSON.stringify(calls)}`);
      if (named) check(calls.length === 1 && calls[0].function.name === 'add', `named: ${JSON.stringify(calls)}`);
      if (!body.parallel_tool_calls) check(calls.length === 1, `parallel_tool_calls false: ${calls.length} calls`);
      check(s.finish === r.finish && JSON.stringify(s.message.tool_calls.map((c) => c.function)) === JSON.stringify(calls.map((c) => c.function)),
            `streamed calls ${JSON.stringify(s.message.tool_calls)} == ${JSON.stringify(calls)}`);
      check(s.message.tool_calls.every((c) => c.id && c.id.startsWith('chatcmpl-tool-')), 'streamed call ids');
      n += calls.length;
      if (seed === 0 && !named) { // the round trip: the call and a tool answer go back, the template renders them
        const back = await client.chat.completions.create({ model: NAME, max_tokens: 8, tools: TOOLS,
          messages: [{ role: 'user', content: 'Weather?' }, r.message,
                     ...calls.map((c) => ({ role: 'tool', tool_call_id: c.id, content: '{"temp": 21}' }))] });
        check(back.choices[0].message.role === 'assistant', 'tool message round trip');
      }
    }
  }
  // auto: the random model writes no call; its text is content, nothing lost
  const a = await ask(client, true, false, { tools: TOOLS, max_tokens: 30, seed: 3, chat_template_kwargs: { enable_thinking: false } });
  check(a.finish === 'length' && !(a.message.tool_calls ?? []).length && a.text.length > 0, `auto without calls: ${JSON.stringify(a)}`);
  console.log(`  tools: ${n} calls validated`);
}

async function testReasoning(client) {
  const body = { max_tokens: 40, temperature: 1, seed: 11, think: true };
  const r = await ask(client, true, false, body), s = await ask(client, true, true, body);
  check(typeof r.message.reasoning_content === 'string' && r.message.reasoning_content.length > 0, 'reasoning_content (no </think>: all reasoning)');
  check(s.message.reasoning_content === r.message.reasoning_content && s.text === r.text, 'streamed reasoning == non-streamed');
  // thinking on, a grammar waits for </think>, which the random model never writes: all reasoning, cut by length
  const wait = await ask(client, true, false, { ...body, guided_choice: ['yes', 'no'] });
  check(wait.finish === 'length' && wait.message.reasoning_content.length > 0 && !wait.message.content,
        `a grammar after the reasoning: ${JSON.stringify(wait.message)}`);
  const hidden = await ask(client, true, false, { ...body, include_reasoning: false });
  check(!('reasoning_content' in hidden.message) && hidden.text === '', `include_reasoning false: ${JSON.stringify(hidden.message)}`);
  const effort = await ask(client, true, false, { ...body, reasoning_effort: 'low', guided_decoding_backend: 'xgrammar' });
  check(effort.finish === 'length', 'reasoning_effort and guided_decoding_backend are accepted');
  const off = await ask(client, true, false, { ...body, chat_template_kwargs: { enable_thinking: false } });
  check(!off.message.reasoning_content && off.text.length > 0, 'thinking off: all content');
}

// Recorded model outputs of each format, forced through a one-string
// guided_choice (the grammar makes the random model say them) under
// tool_choice auto: the parser's tool_calls and content, streamed == not;
// malformed calls stay content, nothing lost.
const RECORDED = {
  hermes: [
    ['Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
     [['get_weather', { city: 'Paris', days: 2 }]], 'Let me check.\n'],
    ['<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2.5}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}\n</tool_call>',
     [['add', { a: 1, b: 2.5 }], ['get_weather', { city: 'Oslo', days: 1 }]], null],
    // broken after its arguments began: whole, it stays content; streamed, the
    // fragments already sent stay sent (as vLLM streams it)
    ['<tool_call>\n{"name": "add", "arguments": {"a": }}\n</tool_call>', [], '<tool_call>\n{"name": "add", "arguments": {"a": }}\n</tool_call>', 'whole'],
    ['Just text, no call.', [], 'Just text, no call.'],
  ],
  qwen3_coder: [
    ['<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>',
     [['get_weather', { city: 'Rome', days: 3 }]], null],
    ['<tool_call>\nhello\n</tool_call> text', [], '<tool_call>\nhello\n</tool_call> text'],
  ],
  llama3_json: [
    ['{"name": "add", "parameters": {"a": 4, "b": 5}}', [['add', { a: 4, b: 5 }]], null],
    ['Sure! {"name": "add", "parameters": {}}', [], 'Sure! {"name": "add", "parameters": {}}'],
  ],
};

async function testRecorded(parser, client) {
  let n = 0;
  for (const [text, want, content, only] of RECORDED[parser]) {
    const body = { tools: TOOLS, guided_choice: [text], max_tokens: 1000, chat_template_kwargs: { enable_thinking: false } };
    const r = await ask(client, true, false, body), s = await ask(client, true, true, body);
    for (const [what, x] of [['non-streamed', r], ['streamed', s]]) {
      if (only === 'whole' && x === s) continue;
      const calls = (x.message.tool_calls ?? []).map((c) => [c.function.name, JSON.parse(c.function.arguments)]);
      check(JSON.stringify(calls) === JSON.stringify(want), `${parser} ${what} ${JSON.stringify(text)}: calls ${JSON.stringify(calls)}`);
      check((x.message.content || null) === content, `${parser} ${what}: content ${JSON.stringify(x.message.content)}, want ${JSON.stringify(content)}`);
      check(x.finish === (want.length ? 'tool_calls' : 'stop'), `${parser} ${what}: finish ${x.finish}`);
      n++;
    }
  }
  console.log(`  recorded ${parser}: ${n} answers`);
}

// Bad parser flags stop `vllm serve` with a message naming them.
function testFlags() {
  for (const [args, must] of [[['--tool-call-parser', 'bogus'], "'bogus'"], [['--reasoning-parser', 'r2'], "'r2'"],
                              [['--enable-auto-tool-choice'], '--tool-call-parser']]) {
    const r = spawnSync(vllm, ['serve', '--model', model, '--port', '0', ...args], { encoding: 'utf8', timeout: 30000 });
    check(r.status === 1 && (r.stdout + r.stderr).includes(must), `serve ${args.join(' ')}: exit ${r.status}: ${r.stderr}`);
  }
}

async function main() {
  testFlags();
  const srv = await startServer();
  const client = new OpenAI({ apiKey: 'none', baseURL: `http://127.0.0.1:${srv.port}/v1`, maxRetries: 0, timeout: 600000 });
  const dir = mkdtempSync(join(tmpdir(), 'vllm-structured-'));
  try {
    await testJsonObjectAndErrors(client);
    await testRecorded('hermes', client);
    for (const parser of ['qwen3_coder', 'llama3_json']) {
      const other = await startServer(parser);
      await testRecorded(parser, new OpenAI({ apiKey: 'none', baseURL: `http://127.0.0.1:${other.port}/v1`, maxRetries: 0 }));
      check(await stopServer(other) === 0, `the ${parser} server exited cleanly`);
    }
    await testTools(client);
    await testReasoning(client);
    await testRegexChoice(client);
    await testSchemas(client, dir, numArg ? Number(numArg) : 300);
  } catch (e) {
    check(false, `exception: ${e.stack}`);
  }
  rmSync(dir, { recursive: true, force: true });
  const code = await stopServer(srv);
  check(code === 0, `the server exited ${code}`);
  console.log(`structured_e2e: ${checks - failures}/${checks} checks passed`);
  process.exit(failures || !checks ? 1 : 0);
}
main();
