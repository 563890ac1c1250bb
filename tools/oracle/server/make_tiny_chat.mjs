// make_tiny_chat.mjs - writes tests/fixtures/tiny_chat/: the nh_dense model
// (random weights, vocab 256) with a byte-level tokenizer that fits its 256
// ids and a ChatML-like chat template, so that `vllm serve` has a text model
// to test with. Checks the files with the oracles (HF tokenizers, and
// @huggingface/jinja for the template) and writes what they give to
// tests/fixtures/tiny_chat/oracle.json for the C tests.
//
// Token ids: 0 <pad>, 1 <s>, 2 </s> (special, added tokens; eos_token_id 2),
// 3..255 the ByteLevel characters of bytes 3..255; no merges. Encoding with
// special tokens prepends <s>.
// Usage: node make_tiny_chat.mjs
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { Template } from '@huggingface/jinja';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');
const here = dirname(fileURLToPath(import.meta.url));
const fixtures = join(here, '../../../tests/fixtures');
const src = join(fixtures, 'nh_dense');
const out = join(fixtures, 'tiny_chat');

// GPT-2's bytes_to_unicode: the printable character ByteLevel uses for a byte.
function byteChars() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) bs.push(b), cs.push(256 + n++);
  const map = new Array(256);
  bs.forEach((b, i) => (map[b] = String.fromCodePoint(cs[i])));
  return map;
}

const SPECIAL = ['<pad>', '<s>', '</s>'];
const chars = byteChars();
const vocab = {};
SPECIAL.forEach((s, i) => (vocab[s] = i));
for (let b = 3; b < 256; b++) vocab[chars[b]] = b;

const added = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
const tokenizer = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: SPECIAL.map((s, i) => added(i, s)),
  normalizer: null,
  pre_tokenizer: byteLevel,
  post_processor: {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
           { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
  },
  decoder: byteLevel,
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [] },
};
const chatTemplate = '{% for m in messages %}<s>{{ m.role }}\n{{ m.content }}</s>\n{% endfor %}' +
                     '{% if add_generation_prompt %}<s>assistant\n{% endif %}';
const tokenizerConfig = {
  bos_token: '<s>', eos_token: '</s>', pad_token: '<pad>', model_max_length: 4096,
  tokenizer_class: 'PreTrainedTokenizerFast', chat_template: chatTemplate,
};

mkdirSync(out, { recursive: true });
copyFileSync(join(src, 'config.json'), join(out, 'config.json'));
copyFileSync(join(src, 'model.safetensors'), join(out, 'model.safetensors'));
writeFileSync(join(out, 'tokenizer.json'), JSON.stringify(tokenizer, null, 1) + '\n');
writeFileSync(join(out, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig, null, 2) + '\n');

// ------------------------------------------------------------- checks --
const fail = (msg) => { console.error(`make_tiny_chat: FAIL: ${msg}`); process.exit(1); };
const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
if (config.vocab_size !== 256 || config.eos_token_id !== 2) fail('the model is not the vocab-256, eos-2 nh_dense');
const tok = Tokenizer.fromString(readFileSync(join(out, 'tokenizer.json'), 'utf8'));
const utf8 = (s) => [...Buffer.from(s, 'utf8')];
const texts = ['Hello, world!', ' leading space', 'tabs\tand\nnewlines', 'ünïcödé ✓ 漢字 🙂', '<s>user\nhi</s>\n'];
const cases = [];
for (const text of texts) {
  const plain = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
  const special = (await tok.encode(text)).getIds();
  // Each byte is its own token, except the special tokens' text.
  const expect = text.includes('<s>') ? null : utf8(text);
  if (expect && JSON.stringify(plain) !== JSON.stringify(expect)) fail(`encode(${JSON.stringify(text)}) = ${plain}`);
  if (special[0] !== 1 || JSON.stringify(special.slice(1)) !== JSON.stringify(plain)) fail('<s> is not prepended');
  const back = await tok.decode(plain, false);
  if (back !== text) fail(`decode(encode(${JSON.stringify(text)})) = ${JSON.stringify(back)}`);
  cases.push({ text, ids: plain, ids_special: special });
}
const sk = await tok.decode([1, 72, 105, 2], true);
if (sk !== 'Hi') fail(`decode skipping specials gave ${JSON.stringify(sk)}`);

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }];
const rendered = new Template(chatTemplate).render({ messages, add_generation_prompt: true, bos_token: '<s>', eos_token: '</s>' });
if (rendered !== '<s>system\nBe brief.</s>\n<s>user\nHi there</s>\n<s>assistant\n') fail(`template gave ${JSON.stringify(rendered)}`);
const chatIds = (await tok.encode(rendered, null, { addSpecialTokens: false })).getIds();
if (chatIds[0] !== 1 || chatIds.filter((x) => x === 2).length !== 2) fail('special tokens in the rendered chat were not matched');

const pkg = (p) => JSON.parse(readFileSync(join(here, 'node_modules', p, 'package.json'), 'utf8')).version;
const oracle = {
  source: `tokenizers@${pkg('tokenizers')}, @huggingface/jinja@${pkg('@huggingface/jinja')}`,
  encode: cases,
  chat: { messages, add_generation_prompt: true, text: rendered, ids: chatIds },
};
writeFileSync(join(out, 'oracle.json'), JSON.stringify(oracle) + '\n');
console.log(`make_tiny_chat: wrote ${out} (${cases.length} encode cases, chat prompt of ${chatIds.length} ids)`);
