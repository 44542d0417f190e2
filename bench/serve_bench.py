#!/usr/bin/env python3
"""Load generator for `hybridlm serve` (a benchmark, not a test): starts the server on a free
loopback port, then for each concurrency level runs a fixed number of streamed completions
(bounded in count and time) and reports aggregate decode throughput and latency percentiles (time
to first token, inter-token latency); then the time to first token of a request whose 2,000-token
prefix is cached, against the same request cold.

    python3 bench/serve_bench.py [-m DIR] [--concurrency 1,8,32,64] [--requests 64] [--max-tokens 64]
                                 [--markdown] [--url http://127.0.0.1:8080/v1]   (--url: a running server)

--url points it at any OpenAI-compatible server instead (llama.cpp's llama-server on the same
weights, for the side-by-side figures in docs/benchmarks.md).
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


class Target:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.base = u.hostname, u.port, u.path.rstrip("/")

    def stream(self, body, timeout=300):
        """One streamed completion: (ttft seconds, [inter-token seconds], tokens, cached tokens)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        t0 = time.perf_counter()
        conn.request("POST", self.base + "/completions", body=json.dumps({**body, "stream": True,
                                                                            "stream_options": {"include_usage": True}}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        ttft, last, gaps, tokens, cached = None, None, [], 0, 0
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                data = event[6:]
                if data == b"[DONE]":
                    continue
                j = json.loads(data)
                if j.get("usage"):
                    tokens = j["usage"]["completion_tokens"]
                    cached = (j["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
                if j.get("choices") and j["choices"][0].get("text"):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
        conn.close()
        return ttft, gaps, tokens, cached


def run_level(target, concurrency, requests, max_tokens, prompt_words, deadline_s):
    results, lock = [], threading.Lock()
    next_i = [0]
    stop_at = time.perf_counter() + deadline_s

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= requests or time.perf_counter() > stop_at:
                return
            body = {"prompt": f"Request {i}: " + "and the word " * prompt_words, "max_tokens": max_tokens,
                    "temperature": 0.8, "seed": i, "ignore_eos": True}
            res = target.stream(body)
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[2] for r in results)
    ttfts = [r[0] for r in results if r[0] is not None]
    gaps = [g for r in results for g in r[1]]
    return {"concurrency": concurrency, "requests": len(results), "tokens": tokens, "seconds": wall,
            "tok_s": tokens / wall if wall > 0 else 0, "ttft_p50": percentile(ttfts, 50),
            "ttft_p90": percentile(ttfts, 90), "itl_p50": percentile(gaps, 50), "itl_p90": percentile(gaps, 90),
            "itl_p99": percentile(gaps, 99)}


def complete(target, body):
    conn = http.client.HTTPConnection(target.host, target.port, timeout=300)
    conn.request("POST", target.base + "/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = json.loads(conn.getresponse().read())
    conn.close()
    return r


def prefix_reuse(target, prefix_tokens):
    """TTFT with a cached prefix against the same request cold, each with 1 generated token:
    (a) a prompt sharing its first prefix_tokens ids with an earlier one, then diverging: restored
    from the last snapshot inside the shared part, and a third such prompt, restored from where the
    second branched off; (b) the next turn of a conversation (text): the
    first turn's prompt and answer, then a new sentence: restored from the first turn's snapshots.
    Returns (cold a, warm a, cached a, third a, cached third a, cold b, warm b, cached b)."""
    shared = [(i * 37 + 11) % 1000 + 100 for i in range(prefix_tokens)]
    cold_a = target.stream({"prompt": [(i * 53 + 7) % 1000 + 100 for i in range(prefix_tokens)] + [5, 6, 7],
                            "max_tokens": 1, "temperature": 0})
    target.stream({"prompt": shared + [1, 2, 3], "max_tokens": 1, "temperature": 0})
    warm_a = target.stream({"prompt": shared + [5, 6, 7], "max_tokens": 1, "temperature": 0})
    # A third prompt on the same branch: the second kept the state where it branched off.
    third_a = target.stream({"prompt": shared + [8, 9, 10], "max_tokens": 1, "temperature": 0})

    def text(seed, n_words):
        return " ".join(f"w{(i * seed + 5) % 211}" for i in range(n_words))

    turn1 = text(31, prefix_tokens // 3)
    answer = complete(target, {"prompt": turn1, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
    turn2 = turn1 + answer["choices"][0]["text"] + " and then what happened next"
    cold_b = target.stream({"prompt": text(17, prefix_tokens // 3) + answer["choices"][0]["text"] +
                            " and then what happened next", "max_tokens": 1, "temperature": 0})
    warm_b = target.stream({"prompt": turn2, "max_tokens": 1, "temperature": 0})
    return cold_a[0], warm_a[0], warm_a[3], third_a[0], third_a[3], cold_b[0], warm_b[0], warm_b[3]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "default"))
    ap.add_argument("--url", help="an OpenAI-compatible server already running (its /v1 base URL)")
    ap.add_argument("--hybridlm", default=os.path.join(ROOT, "build", "hybridlm"))
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--requests", type=int, default=64, help="requests per level (at least the concurrency)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--deadline", type=float, default=120, help="seconds per level at most")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--server-args", default="", help="more flags for hybridlm serve (e.g. \"--no-mmap\")")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    proc = None
    if a.url:
        target = Target(a.url)
        name = a.url
    else:
        proc = subprocess.Popen([a.hybridlm, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads),
                                 "--slots", str(max(levels)), "--max-queue", str(4 * max(levels)), "-c", "4096",
                                 *a.server_args.split()],
                                stderr=subprocess.PIPE, text=True)
        port = None
        for line in proc.stderr:
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            port = int(m.group(1)) if m else port
            if "serve: ready" in line:
                break
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        target = Target(f"http://127.0.0.1:{port}/v1")
        name = f"hybridlm serve -m {os.path.basename(os.path.normpath(a.model))} -t {a.threads}"
    try:
        rows = [run_level(target, c, max(a.requests, c), a.max_tokens, a.prompt_words, a.deadline) for c in levels]
        reuse = prefix_reuse(target, a.prefix_tokens)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
    base = rows[0]["tok_s"]
    if a.markdown:
        print(f"{name}; {a.max_tokens} tokens per request, prompts of ~{a.prompt_words * 3 + 3} words\n")
        print("| streams | requests | decode tok/s | vs 1 stream | TTFT p50 / p90 ms | inter-token p50 / p90 / p99 ms |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['concurrency']} | {r['requests']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | "
                  f"{r['ttft_p50'] * 1e3:.0f} / {r['ttft_p90'] * 1e3:.0f} | {r['itl_p50'] * 1e3:.1f} / "
                  f"{r['itl_p90'] * 1e3:.1f} / {r['itl_p99'] * 1e3:.1f} |")
        ca, wa, na, ta, nta, cb, wb, nb = reuse
        print(f"\nprefix reuse, a {a.prefix_tokens}-token shared prefix then a different end: TTFT cold "
              f"{ca * 1e3:.0f} ms, warm {wa * 1e3:.0f} ms ({na} tokens restored): {ca / wa:.1f}x; "
              f"a third such prompt {ta * 1e3:.0f} ms ({nta} restored): {ca / ta:.1f}x")
        print(f"prefix reuse, the next turn of a ~{a.prefix_tokens}-token conversation: TTFT cold {cb * 1e3:.0f} ms, "
              f"warm {wb * 1e3:.0f} ms ({nb} tokens restored): {cb / wb:.1f}x")
    else:
        for r in rows:
            print(json.dumps(r))
        ca, wa, na, ta, nta, cb, wb, nb = reuse
        print(json.dumps({"prefix_tokens": a.prefix_tokens, "shared_prefix": {"ttft_cold_s": ca, "ttft_warm_s": wa,
                                                                              "cached_tokens": na,
                                                                              "ttft_third_s": ta,
                                                                              "third_cached_tokens": nta},
                          "next_turn": {"ttft_cold_s": cb, "ttft_warm_s": wb, "cached_tokens": nb}}))


if __name__ == "__main__":
    sys.exit(main())
