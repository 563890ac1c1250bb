// openai_responses.mjs - /v1/responses through the official `openai` npm
// client: responses.create with text input and instructions, with a message
// list (the same text as chat.completions of the same messages, greedy),
// max_output_tokens (status incomplete), responses.stream with its typed
// events (the deltas add up to the final text), and 400s for what needs
// server-side state. Exits 77 (skipped) when the client is not installed.
// usage: node openai_responses.mjs VLLM_BINARY MODEL_DIR
import { check, requireOpenAI, startServer as spawnServer, summary } from './serve_proc.mjs';

const OpenAI = requireOpenAI();
const [vllm, model] = process.argv.slice(2);
const KEY = 'test-key-r', NAME = 'tiny-chat';



const startServer = () => spawnServer(vllm, ['serve', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
  '--api-key', KEY, '--served-model-name', NAME, '--max-model-len', '256']);

async function expectStatus(p, status, param, what) {
  try {
    await p;
    check(false, `${what}: no error`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status, `${what}: ${e.status} ${e.message}`);
    if (param) check(e.param === param, `${what}: param ${e.param}, want ${param}`);
  }
}

async function main() {
  const srv = await startServer();
  const client = new OpenAI({ apiKey: KEY, baseURL: `http://127.0.0.1:${srv.port}/v1`, maxRetries: 0 });
  try {
    // text input and instructions
    const a = await client.responses.create({ model: NAME, input: 'hello', max_output_tokens: 4 });
    const b = await client.responses.create({ model: NAME, input: 'hello', instructions: 'Be brief.',
                                              max_output_tokens: 4 });
    check(a.object === 'response' && a.id.startsWith('resp_'), `object ${a.object}, id ${a.id}`);
    check(a.status === 'incomplete' && a.incomplete_details?.reason === 'max_output_tokens',
          `max_output_tokens: status ${a.status}`);
    check(a.usage.output_tokens === 4 && a.usage.total_tokens === a.usage.input_tokens + 4, 'usage');
    check(typeof a.output_text === 'string' && a.output_text.length > 0, `output_text ${a.output_text}`);
    check(b.usage.input_tokens > a.usage.input_tokens, 'instructions did not reach the prompt');
    check(b.instructions === 'Be brief.', 'instructions are not echoed');

    // a message list: what chat.completions answers for the same messages
    const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'hi there' }];
    const r = await client.responses.create({
      model: NAME, temperature: 0, max_output_tokens: 6,
      input: [{ role: 'system', content: 'You are terse.' },
              { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'hi there' }] }],
    });
    const c = await client.chat.completions.create({ model: NAME, messages, temperature: 0, max_tokens: 6 });
    check(r.output_text === c.choices[0].message.content,
          `message-list input: ${JSON.stringify(r.output_text)} vs chat ${JSON.stringify(c.choices[0].message.content)}`);
    check(r.usage.input_tokens === c.usage.prompt_tokens, 'message-list input: prompt tokens differ from chat');

    // streaming: typed events, deltas adding up to the final text
    const stream = client.responses.stream({ model: NAME, input: 'stream me', temperature: 0, max_output_tokens: 8 });
    const types = new Set();
    let deltas = '', seq = -1, ordered = true;
    for await (const ev of stream) {
      types.add(ev.type);
      if (ev.sequence_number !== seq + 1) ordered = false;
      seq = ev.sequence_number;
      if (ev.type === 'response.output_text.delta') deltas += ev.delta;
    }
    const final = await stream.finalResponse();
    for (const t of ['response.created', 'response.in_progress', 'response.output_item.added',
                     'response.content_part.added', 'response.output_text.delta', 'response.output_text.done',
                     'response.content_part.done', 'response.output_item.done'])
      check(types.has(t), `stream: no ${t} event`);
    check(types.has('response.completed') || types.has('response.incomplete'), 'stream: no final event');
    check(ordered, 'stream: sequence numbers are not 0, 1, 2, ...');
    check(deltas.length > 0 && deltas === final.output_text, `stream: deltas ${JSON.stringify(deltas)} vs final ${
      JSON.stringify(final.output_text)}`);
    const same = await client.responses.create({ model: NAME, input: 'stream me', temperature: 0, max_output_tokens: 8 });
    check(same.output_text === final.output_text, 'stream and non-stream answers differ (greedy)');

    // nothing is stored
    await expectStatus(client.responses.create({ model: NAME, input: 'x', store: true }), 400, 'store', 'store: true');
    await expectStatus(client.responses.create({ model: NAME, input: 'x', previous_response_id: 'resp_1' }), 400,
                       'previous_response_id', 'previous_response_id');
    await expectStatus(client.responses.create({ model: NAME, input: [] }), 400, 'input', 'empty input');
    await expectStatus(client.responses.create({ model: NAME, input: 'x', max_output_tokens: 1000 }), 400,
                       'max_output_tokens', 'max_output_tokens past max_model_len');
  } finally {
    srv.proc.kill('SIGTERM');
  }
  const code = await new Promise((res) => srv.proc.on('exit', (c) => res(c)));
  check(code === 0, `the server exited ${code} after SIGTERM`);
  const rc = summary('openai_responses');
  if (rc) {
    console.error(srv.log());
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(`FAIL: ${e.stack || e}`);
  process.exit(1);
});
