// serve_proc.mjs - what the node server tests share: a `vllm serve` child
// started on a free port (the port it prints) and stopped with SIGTERM
// (SIGKILL after 20 s); the official `openai` client (exit 77, skipped, when
// it is not installed); and the check counter, whose summary fails a test
// that checked nothing.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export function requireOpenAI() {
  const here = dirname(fileURLToPath(import.meta.url));
  try {
    return createRequire(join(here, '../../tools/oracle/server/package.json'))('openai');
  } catch (e) {
    console.error(`SKIP: the openai npm package is not installed (scripts/install-deps.sh): ${e.message}`);
    process.exit(77);
  }
}

export const tally = { checks: 0, failures: 0 };
export function check(cond, what) {
  tally.checks++;
  if (!cond) {
    tally.failures++;
    console.error(`CHECK failed: ${what}`);
  }
}
// Prints the count; the exit code: 1 on a failure or when nothing was checked.
export function summary(name) {
  if (tally.checks === 0) {
    console.error(`${name}: FAIL: zero checks ran`);
    return 1;
  }
  console.log(`${name}: ${tally.checks - tally.failures}/${tally.checks} checks passed`);
  return tally.failures ? 1 : 0;
}

// args: everything after `vllm`, with `--port 0`. Resolves {proc, port, log()}.
export function startServer(vllm, args, timeoutMs = 60000) {
  const proc = spawn(vllm, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server did not listen in ${timeoutMs / 1000} s:\n${log}`)), timeoutMs);
    const onData = (d) => {
      log += d;
      const m = log.match(/ on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, port: Number(m[1]), log: () => log });
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the server exited (${code}) before listening:\n${log}`));
    });
  });
}

// Resolves the exit code (128 for a signal, -1 if it had to be killed).
export function stopServer(srv) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => { srv.proc.kill('SIGKILL'); resolve(-1); }, 20000);
    srv.proc.removeAllListeners('exit');
    srv.proc.on('exit', (code, sig) => { clearTimeout(timer); resolve(sig ? 128 : code); });
    srv.proc.kill('SIGTERM');
  });
}
