// gen_corpus.mjs - writes tests/fixtures/tokenizer/corpus.jsonl: the strings
// every tokenizer is checked on. Hand-collected samples of many scripts and
// edge cases, plus strings generated from a seeded PRNG (deterministic).
// One JSON value a line: a string, or {"hex": "..."} for bytes that are not
// valid UTF-8 (the oracle sees them as Rust's from_utf8_lossy would).
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, '../../../tests/fixtures/tokenizer/corpus.jsonl');

let seed = 0x5eed1234;
function rnd() { // mulberry32
  seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));

const english = [
  'Hello world', 'The quick brown fox jumps over the lazy dog.', "I'm sure you'll see they've gone; it's John's.",
  "DON'T SHOUT, WE'LL HEAR YOU'RE HERE", 'A man, a plan, a canal: Panama!', 'e.g. i.e. etc. Mr. Smith vs. Dr. Jones',
  'Tokenization is the first step of every language model pipeline.', 'Email me at someone@example.com or visit https://example.org/path?q=1&x=2#frag',
  'She said, "No way!" and left...', 'The year 2024 had 366 days; 3.14159 is pi; 1,000,000 is a million.',
  '  leading spaces', 'trailing spaces   ', 'multiple   internal    spaces', 'UPPER lower MiXeD CaSe',
  'camelCaseIdentifier snake_case_identifier kebab-case-identifier', "rock 'n' roll, 'quoted', ''double''",
  'Naïve café résumé coöperate façade jalapeño', 'Ünïcödé äccents àre fün', 'Straße, Æsir, Œuvre, ﬁne ligatures ﬂow',
  'The ſ long s and the K Kelvin sign and ǅ titlecase', "It’s a curly apostrophe: can’t won’t I’m",
];
const world = [
  '你好，世界！这是一个测试。', '我爱北京天安门，天安门上太阳升。', '中华人民共和国成立于1949年10月1日。',
  'こんにちは、世界。カタカナとひらがなと漢字。', '東京スカイツリーは634メートルです。', 'ｶﾀｶﾅ半角とＡＢＣ全角',
  '안녕하세요 세계! 한국어 문장입니다.', 'مرحبا بالعالم! هذه جملة عربية.', 'اللُّغَةُ العَرَبِيَّةُ مع التشكيل', '٠١٢٣٤٥٦٧٨٩ أرقام عربية',
  'नमस्ते दुनिया! यह हिंदी वाक्य है।', 'क्षत्रिय ज्ञान श्री द्वार', 'Привет, мир! Это русский текст.', 'Γειά σου Κόσμε! Ελληνικά ΣΊΣΥΦΟΣ',
  'שלום עולם! זה טקסט בעברית.', 'สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง', 'Xin chào thế giới! Tiếng Việt có dấu.',
  'Türkçe: İstanbul, ılık, şğüöç', 'Polski: zażółć gęślą jaźń', 'ქართული ენა', 'Հայերեն լեզու', 'አማርኛ ቋንቋ',
  'தமிழ் மொழி', 'বাংলা ভাষা', '日本語とEnglishのmixed文章です。', 'Emoji in 中文😀文本',
];
const emoji = [
  '😀😃😄😁', '👍🏽 thumbs up with skin tone', '👨‍👩‍👧‍👦 family ZWJ', '👩🏾‍💻 technologist', '🏳️‍🌈 rainbow flag', '🇺🇸🇫🇷🇯🇵 flags',
  '1️⃣ #️⃣ keycaps', '❤️ vs ❤ (variation selector)', '🧑‍🤝‍🧑 people holding hands', '🫠🫡🫢 newer emoji', 'text😀text😀',
  '🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland tag sequence', '👁️‍🗨️', '🤷‍♀️🤦‍♂️', '🐕‍🦺 service dog',
];
const combining = [
  'e\u0301 vs é', 'A\u030A vs Å vs \u212B', 'n\u0303 and ñ', 'Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ zalgo', 'a\u0300\u0301\u0302\u0303\u0304 stacked',
  '\u0301 leading combining mark', 'क\u093C nukta', '한 vs \u1112\u1161\u11AB jamo', 'ﬀ ﬃ ﬄ ligatures', '①②③ ⑴⑵ circled', 'x² y³ H₂O',
  '½ ¼ ¾ fractions', 'Ⅻ roman numeral', '™ ℠ © ®', 'ａｂｃ fullwidth', '\u00C5\u0041\u030A', 'ǆ ǅ Ǆ digraphs',
];
const code = [
  'def foo(x):\n    return x * 2\n', 'for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}', 'const f = (a, b) => a ?? b;',
  '#include <stdio.h>\nint main(void) { printf("hi\\n"); return 0; }', '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
  '<div class="x"><p>Hello</p></div>', 'SELECT * FROM users WHERE id = 42 AND name LIKE \'%bob%\';', 'x = [i**2 for i in range(10) if i % 2]',
  'fn main() { let v: Vec<u8> = vec![0; 16]; println!("{:?}", v); }', '    indented\n        more\n\tTabbed', '$ ls -la | grep ".txt" > out.log 2>&1',
  'a+=1;b-=2;c*=3;d/=4;e%=5;f**=6', '// comment\n/* block */\n# hash\n-- sql', 'if (a && b || !c) { return; }', '0x1F 0b1010 1e-9 3.0f 42L',
  '```python\nprint("hi")\n```', '\\begin{equation} E = mc^2 \\end{equation}', 'https://github.com/user/repo/blob/main/src/file.c#L10-L20',
];
const spaces = [
  ' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\n\n\n', '\r\n', '\r\n\r\n', ' \n ', '\n \n', 'a\n\nb', 'a \n b', 'a\t\tb',
  'a   \n   b', 'end with newline\n', '\n\nstart with newlines', 'x\u00A0y nbsp', 'x\u3000y ideographic space', 'x\u2009y thin space',
  'x\u0085y NEL', 'x\u200By zero width space', 'x\u2028y line sep', 'x\u202Fy narrow nbsp', 'x\u000By vertical tab', 'x\u000Cy form feed',
  '     \t\n   mixed   \t  ', 'word\u00A0\u00A0word', '\u3000\u3000indented', 'trailing\u00A0', 'a \u00A0b', ' \u0085 ',
];
const digits = [
  '0', '7', '12', '123', '1234', '12345', '123456789012345678901234567890', '3.14159265358979', '-42', '+1 (555) 123-4567',
  '1,234,567.89', '2024-01-15T10:30:00Z', 'v1.2.3-rc.4', '١٢٣٤٥', '۱۲۳', '१२३४', '１２３４', '²³', '⅕', '12abc34def', 'a1b2c3',
  '000000', '9999999999', '0.0001', '1e10', '192.168.0.1', '$1,000.00', '50%', '#1', 'No. 5',
];
const regex_edges = [
  "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d", "'LL", "'Ve", "x's", "'ſ", "'K", "''", "'", "'''s",
  '!!!', '???', '...', '!?!?', '---', '___', '***', '...\n', '!!\n\n', ' !', ' !!', '  !!', 'a.b', 'a. b', 'a .b',
  ' a', '  a', '   a', 'a ', 'a  ', '\na', ' \na', 'a\n ', '  \n\n  ', '\r', '\r\r', '\n\r', ' \r\n ', 'a\r\n\r\nb',
  '/', '//', 'a/b/c', '/\n', '/\r\n', ' /\n/', 'A/B', 'HTTP/1.1', 'iPhone', 'McDonald', 'ABCdef', 'abcDEF', 'XMLHttpRequest',
  'ǅungla', 'ΣΑΣ', 'ßS', 'İi', 'ﬃx', '\u00AD soft hyphen', '\uFEFF BOM', '\uFFFD replacement', '\uFFFF nonchar', '\uE000 private',
  '\u0000 nul', 'a\u0000b', '\u0001\u0002\u001F controls', '\u007F del', '\u200D zwj alone', '\u200C zwnj', '\u2060 word joiner',
  '\u{10FFFF}', '\u{1D400}\u{1D401} math bold', '\u{20000} CJK ext B', '\u{1F600}', '\u{E0041} tag',
];
const specials = [
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n', '<s>', '</s>', '<unk>',
  'Hello<s>world</s>', ' <s> ', '<s><s>', '<|begin_of_text|>', '<|eot_id|>', '<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>',
  '<｜begin▁of▁sentence｜>', '<｜User｜>hi<｜Assistant｜>', '<｜end▁of▁sentence｜>', '<bos>', '<eos>', '<start_of_turn>user\nhi<end_of_turn>',
  '<|startoftext|>', '<|return|>', '<|channel|>analysis<|message|>text<|end|>', '<tool_call>{"name": "f"}</tool_call>', '<think>\nhmm\n</think>',
  '<|im_start', '<|im_start|', 'im_start|>', '< s>', '<S>', '<|IM_START|>', 'x<|im_end|>y', '  <|im_end|>  ', '<pad><mask>', '<unused0><unused99>',
  '<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>', '[multimodal]', '<start_of_image>', '<|reserved_special_token_5|>', '<0x41>', '<0xFF>',
  '▁', '▁▁hello', 'Ġhello', 'Ċ', 'âĢĻ',
];
const invalid_hex = [
  'ff', 'c3', 'c328', 'e282', 'e28228', 'f0908c', 'f09f9880', 'f09f98', '80', 'bf80', 'fe', 'c0af', 'eda080', 'edbfbf',
  'f4908080', '61ff62', '68656c6c6fe4bda0', 'e4bda0e5a5bdff', 'ffffff', '41c2', 'e0a080', 'f8888080', '2020ff2020', '0a0dff0a',
];

const entries = [];
const add = (s) => entries.push(s);
for (const list of [english, world, emoji, combining, code, spaces, digits, regex_edges, specials]) list.forEach(add);
for (const h of invalid_hex) add({ hex: h });
add('');

// Pools for generated strings.
const words = english.join(' ').split(/\s+/).concat(world.join(' ').split(/\s+/), code.join(' ').split(/\s+/)).filter((w) => w);
const chars = [...new Set([...english, ...world, ...emoji, ...combining, ...code, ...spaces, ...digits, ...regex_edges].join(''))];
const seps = [' ', '  ', '\n', '\t', ' \n', '\n\n', '', ', ', '. ', ' - ', '\r\n', '\u00A0', '   '];

// Sentences of random words and separators.
for (let i = 0; i < 900; i++) {
  let s = '';
  const n = int(1, 14);
  for (let k = 0; k < n; k++) s += (k ? pick(seps) : '') + pick(words);
  if (rnd() < 0.2) s = pick(seps) + s;
  if (rnd() < 0.2) s += pick(seps);
  add(s);
}
// Random code points from the collected alphabet.
for (let i = 0; i < 600; i++) {
  let s = '';
  const n = int(1, 24);
  for (let k = 0; k < n; k++) s += pick(chars);
  add(s);
}
// Special-token text mixed into normal text.
for (let i = 0; i < 250; i++) add(pick(words) + pick(['', ' ', '\n']) + pick(specials) + pick(['', ' ', '\n', '  ']) + pick(words));
// Digit runs, whitespace runs and punctuation runs around words.
for (let i = 0; i < 200; i++) {
  const d = String(Math.floor(rnd() * 10 ** int(1, 12)));
  const ws = ' \t\n\r'.split('');
  let w = '';
  for (let k = int(1, 8); k > 0; k--) w += pick(ws);
  add(pick([d + w + pick(words), pick(words) + w + d, w + d + w, d + pick(['.', ',', '', '-', '/']) + d, pick(['!', '?', '...', '"', "'"]).repeat(int(1, 5)) + w]));
}
// Random unicode scalars of every plane (no surrogates).
for (let i = 0; i < 150; i++) {
  let s = '';
  for (let k = int(1, 10); k > 0; k--) {
    let cp = pick([int(0x20, 0x7e), int(0xa0, 0x2fff), int(0x3000, 0x9fff), int(0xac00, 0xd7a3), int(0xe000, 0xfffd), int(0x10000, 0x1faff)]);
    s += String.fromCodePoint(cp);
  }
  add(s);
}
// A few long strings.
for (let i = 0; i < 6; i++) {
  let s = '';
  while (s.length < 3000) s += pick(words) + pick(seps);
  add(s);
}
add('a'.repeat(2000));
add(' '.repeat(500) + 'x');
add('\n'.repeat(300));
add('1234567890'.repeat(50));
add('😀'.repeat(200));
add('你好'.repeat(300));

writeFileSync(out, entries.map((e) => JSON.stringify(e)).join('\n') + '\n');
console.log(`gen_corpus: ${entries.length} entries -> ${out}`);
