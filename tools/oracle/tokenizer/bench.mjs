// bench.mjs - encode speed of vllm.c's tokenizer against the HF tokenizers
// binding, single-threaded, on tests/fixtures/tokenizer/corpus.jsonl.
// Usage: node tools/oracle/tokenizer/bench.mjs [BUILD_DIR] [SECONDS] [name...]
// (BUILD_DIR defaults to build; run `make` first). The binding encodes the
// whole corpus with encodeBatch (no per-call promise overhead) with rayon
// limited to one thread; the C side runs build/tok_bench in the same run.
process.env.RAYON_NUM_THREADS = '1';
process.env.TOKENIZERS_PARALLELISM = 'false';
import { execFileSync } from 'node:child_process';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadOracle, modelDir, readCorpus, REAL } from './oracle.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '../../..');
const build = process.argv[2] || 'build';
const secs = Number(process.argv[3] || 3);
const names = process.argv.length > 4 ? process.argv.slice(4) : REAL;
// The C bench skips {"hex"} entries; so does this one.
const corpus = readCorpus().filter((_, i, a) => true);
import { readFileSync } from 'node:fs';
const lines = readFileSync(join(root, 'tests/fixtures/tokenizer/corpus.jsonl'), 'utf8').trimEnd().split('\n');
const texts = lines.map((l) => JSON.parse(l)).filter((v) => typeof v === 'string');
const bytes = texts.reduce((n, s) => n + Buffer.byteLength(s), 0);
void corpus;

console.log(`corpus: ${texts.length} strings, ${(bytes / 1e6).toFixed(3)} MB; ${secs}s per side; single thread`);
console.log('tokenizer      vllm.c MB/s   HF tokenizers MB/s   ratio');
for (const name of names) {
  const c = JSON.parse(execFileSync(join(root, build, 'tok_bench'), [modelDir(name), join(root, 'tests/fixtures/tokenizer/corpus.jsonl'), String(secs)]).toString());
  const { tok } = loadOracle(name);
  await tok.encodeBatch(texts.slice(0, 50), { addSpecialTokens: false }); // warm up
  let rounds = 0;
  const t0 = process.hrtime.bigint();
  let el = 0;
  do {
    await tok.encodeBatch(texts, { addSpecialTokens: false });
    rounds++;
    el = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (el < secs);
  const hf = (bytes * rounds) / 1e6 / el;
  console.log(`${name.padEnd(14)} ${c.mb_per_s.toFixed(2).padStart(11)}   ${hf.toFixed(2).padStart(18)}   ${(c.mb_per_s / hf).toFixed(2)}x`);
}
