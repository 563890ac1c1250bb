// serve_proc.mjs - a `vllm serve` child for the node tests: started on a
// free port (the port it prints), stopped with SIGTERM (SIGKILL after 20 s).
import { spawn } from 'node:child_process';

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
