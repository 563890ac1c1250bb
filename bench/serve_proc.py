"""serve_proc.py - starts `vllm serve` for the bench scripts beside it
(structured_serve.py, serve_load.py) and returns it with the port it took."""
import re
import subprocess
import threading


def start_server(vllm, model, extra, echo=False):
    """`vllm serve --model MODEL --port 0 EXTRA...`: (process, port) once it
    serves; its later output is drained in the background."""
    proc = subprocess.Popen([vllm, "serve", "--model", model, "--port", "0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    port = None
    for line in proc.stdout:
        if echo:
            print(line, end="", flush=True)
        m = re.search(r" on http://[\d.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "the server did not start"
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, port
