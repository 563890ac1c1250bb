// loglikelihood.mjs - log-likelihoods as lm-evaluation-harness computes them,
// through the official `openai` npm client (completions with echo, logprobs
// and max_tokens 0), against `vllm generate --dump-logits` of the same text
// (the raw logits of every prompt position, log-softmaxed here in double).
// The server prefills in chunks of 4 tokens with prefix caching on, and each
// text goes twice (the second finds its prompt cached and must not use it);
// chat's and completions' prompt_logprobs lists are checked too.
// Exits 77 (skipped) when the client is not installed.
// usage: node loglikelihood.mjs VLLM_BINARY MODEL_DIR
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { check, requireOpenAI, startServer, stopServer, summary } from './serve_proc.mjs';

const OpenAI = requireOpenAI();
const [vllm, model] = process.argv.slice(2);
const TOL = 1e-4; // per token: fp32 on both sides, different prefill chunks


// The reference: every prompt token's log-prob (the first: null) and rank
// from `vllm generate`'s logits of the text.
function reference(text, dir) {
  const out = join(dir, 'logits.json');
  execFileSync(vllm, ['generate', '--model', model, '--prompt', text, '--max-tokens', '1', '--threads', '1',
    '--dump-logits', out], { stdio: ['ignore', 'ignore', 'inherit'] });
  const { prompt_ids: ids, logits } = JSON.parse(readFileSync(out, 'utf8'));
  const lp = [null], rank = [null];
  for (let i = 1; i < ids.length; i++) {
    const row = logits[i - 1], mx = Math.max(...row);
    const lse = mx + Math.log(row.reduce((s, x) => s + Math.exp(x - mx), 0));
    lp.push(row[ids[i]] - lse);
    rank.push(row.filter((x) => x >= row[ids[i]]).length);
  }
  return { ids, lp, rank };
}

const texts = ['Hello, world! A log-likelihood, token by token.', 'tabs\tand\nnewlines', 'ab'];
const dir = mkdtempSync(join(tmpdir(), 'vllm-ll-'));
const srv = await startServer(vllm, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
  '--served-model-name', 'tiny', '--max-num-batched-tokens', '4']);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${srv.port}/v1`, apiKey: 'none', maxRetries: 0 });
try {
  for (const text of texts) {
    const ref = reference(text, dir);
    const want = ref.lp.slice(1).reduce((s, x) => s + x, 0);
    for (let pass = 0; pass < 2; pass++) { // the second: the prompt is in the prefix cache
      const r = await client.completions.create({ model: 'tiny', prompt: text, echo: true, logprobs: 1, max_tokens: 0,
        temperature: 0 });
      const c = r.choices[0], lps = c.logprobs;
      const what = `${JSON.stringify(text)} pass ${pass}`;
      check(c.text === text, `${what}: text ${JSON.stringify(c.text)} is not the prompt alone`);
      check(lps.tokens.length === ref.ids.length && lps.token_logprobs.length === ref.ids.length,
        `${what}: ${lps.token_logprobs.length} log-probs for ${ref.ids.length} prompt tokens`);
      check(lps.token_logprobs[0] === null && lps.top_logprobs[0] === null, `${what}: the first token has a log-prob`);
      let got = 0, worst = 0;
      for (let i = 1; i < ref.ids.length; i++) {
        got += lps.token_logprobs[i];
        worst = Math.max(worst, Math.abs(lps.token_logprobs[i] - ref.lp[i]));
        const e = c.prompt_logprobs[i]?.[String(ref.ids[i])];
        check(e && Math.abs(e.logprob - ref.lp[i]) <= TOL && e.rank === ref.rank[i],
          `${what}: prompt_logprobs[${i}] ${JSON.stringify(e)}, want logprob ${ref.lp[i]} rank ${ref.rank[i]}`);
        // lm-evaluation-harness's is_greedy: the token is the top one exactly when its rank is 1
        const top = Math.max(...Object.values(lps.top_logprobs[i]));
        check((ref.rank[i] === 1) === (Math.abs(top - lps.token_logprobs[i]) <= TOL), `${what}: token ${i}'s greediness`);
      }
      check(c.prompt_logprobs?.[0] === null, `${what}: prompt_logprobs[0] is not null`);
      check(worst <= TOL, `${what}: a token's log-prob is off by ${worst}`);
      check(Math.abs(got - want) <= TOL * ref.ids.length, `${what}: log-likelihood ${got}, vllm generate's ${want}`);
      check(r.usage.prompt_tokens === ref.ids.length, `${what}: usage.prompt_tokens ${r.usage.prompt_tokens}`);
      if (pass === 1) console.log(`${what}: log-likelihood ${got.toFixed(6)} (vllm generate: ${want.toFixed(6)})`);
    }
  }
  // chat: the list at the response's top level, over the templated prompt
  const chat = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi there' }],
    max_tokens: 2, prompt_logprobs: 2 });
  const pl = chat.prompt_logprobs;
  check(Array.isArray(pl) && pl.length === chat.usage.prompt_tokens && pl[0] === null,
    `chat: prompt_logprobs ${JSON.stringify(pl)?.slice(0, 200)}`);
  for (let i = 1; Array.isArray(pl) && i < pl.length; i++) {
    const entries = Object.values(pl[i]);
    check(entries.length >= 2 && entries.length <= 3, `chat: prompt_logprobs[${i}] has ${entries.length} entries`);
    check(entries.some((e) => e.rank === 1) && entries.every((e) => e.logprob <= 0 && typeof e.decoded_token === 'string'),
      `chat: prompt_logprobs[${i}] ${JSON.stringify(pl[i])}`);
  }
  try {
    await client.completions.create({ model: 'tiny', prompt: 'x', prompt_logprobs: 1, stream: true });
    check(false, 'prompt_logprobs with stream: no error');
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === 400, `prompt_logprobs with stream: ${e.message}`);
  }
} finally {
  check(await stopServer(srv) === 0, 'the server did not exit 0 on SIGTERM');
  rmSync(dir, { recursive: true, force: true });
}
process.exit(summary('loglikelihood'));
