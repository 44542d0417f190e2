"""`hybridlm serve` over loopback: every endpoint, streaming and not, as OpenAI's API reference
shapes them; the official `openai` npm client (tests/server/openai_client.mjs) against it; 16
concurrent clients get the text of the same requests one by one; prefix reuse on a pure SSM and a
hybrid returns a cold run's tokens; admission queues and refuses; bad requests get a 4xx JSON
error naming the field while the server keeps serving. Every wait is bounded."""
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request

from cli_common import check, exe, finish, make_model, run, scratch, start

start()
hybrid = make_model("hybrid", "hybridlm-tiny", 21)
ssm = make_model("ssm", "mamba2-tiny", 22)
servers = []


class Server:
    def __init__(self, model, *flags):
        self.proc = subprocess.Popen([exe, "serve", "-m", model, "--port", "0", "-t", "2", *flags],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        servers.append(self)
        self.log = []
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "serve: ready" in line:
                break
        # Keep reading stderr so that the server never blocks on a full pipe.
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True).start()
        self.ready = self.port is not None and self.get("/health")[0] == 200

    def request(self, method, path, body=None, headers=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        raw = r.read()
        hdrs = dict(r.getheaders())
        conn.close()
        try:
            return r.status, json.loads(raw), hdrs
        except ValueError:
            return r.status, raw.decode("utf-8", "replace"), hdrs

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stream(self, path, body):
        """The SSE events of a streamed request: parsed JSON chunks, with the raw lines."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read().decode()
        conn.close()
        events = [e[len("data: "):] for e in raw.split("\n\n") if e.startswith("data: ")]
        return r.status, r.getheader("Content-Type"), events

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def completion_text(resp):
    return resp["choices"][0]["text"] if isinstance(resp, dict) and "choices" in resp else None


try:
    srv = Server(hybrid, "--slots", "4", "--max-queue", "32")
    check("serve: listens on a free port and /health answers 200 once loaded", srv.ready, "".join(srv.log)[-400:])

    # ---- the endpoints ----
    st, models, _ = srv.get("/v1/models")
    check("GET /v1/models lists the model by its directory name",
          st == 200 and models["object"] == "list" and models["data"][0]["id"] == "hybrid" and
          models["data"][0]["object"] == "model", models)
    st, body, hdrs = srv.post("/v1/completions", {"model": "hybrid", "prompt": "The quick brown fox", "max_tokens": 12,
                                                  "temperature": 0, "ignore_eos": True})
    check("completions: 200, application/json, OpenAI's fields",
          st == 200 and hdrs.get("Content-Type", "").startswith("application/json") and
          body["object"] == "text_completion" and body["id"].startswith("cmpl-") and
          isinstance(body["created"], int) and body["model"] == "hybrid" and
          set(body["choices"][0]) == {"index", "text", "logprobs", "finish_reason"}, body)
    check("completions: usage counts prompt and generated tokens",
          body["usage"]["completion_tokens"] == 12 and body["usage"]["total_tokens"] ==
          body["usage"]["prompt_tokens"] + 12 and "cached_tokens" in body["usage"]["prompt_tokens_details"], body)
    check("completions: finish_reason length at max_tokens", body["choices"][0]["finish_reason"] == "length")
    greedy = body["choices"][0]["text"]
    # The same greedy run through `hybridlm generate` (generate(), not the scheduler).
    rc, out, err = run("generate", "-m", hybrid, "-p", "The quick brown fox", "-n", "12", "--temp", "0", "--ignore-eos",
                       "--no-display-prompt", "--quiet", "-t", "2")
    check("completions: greedy text equals hybridlm generate --temp 0", rc == 0 and out[:-1] == greedy,
          (out, greedy, err[-200:]))

    st, ctype, events = srv.stream("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 12,
                                                       "temperature": 0, "ignore_eos": True, "stream": True,
                                                       "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in events[:-1]]
    check("completions stream: text/event-stream ending with [DONE]",
          st == 200 and ctype.startswith("text/event-stream") and events[-1] == "[DONE]", events[-3:])
    check("completions stream: the pieces join to the non-streamed text",
          "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == greedy)
    check("completions stream: one chunk with finish_reason, then a usage chunk with no choices",
          [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length" and
          chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12 and
          all(c["usage"] is None for c in chunks[:-1]) and len({c["id"] for c in chunks}) == 1, chunks[-2:])

    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]
    st, chat, _ = srv.post("/v1/chat/completions", {"model": "hybrid", "messages": msgs, "max_completion_tokens": 8,
                                                    "temperature": 0, "ignore_eos": True})
    check("chat: 200 with an assistant message",
          st == 200 and chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-") and
          chat["choices"][0]["message"]["role"] == "assistant" and
          isinstance(chat["choices"][0]["message"]["content"], str) and
          chat["choices"][0]["message"]["refusal"] is None and chat["usage"]["completion_tokens"] == 8, chat)
    st, _, events = srv.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0,
                                                        "ignore_eos": True, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    check("chat stream: role first, content deltas join to the message, a finish chunk with an empty delta",
          chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} and
          "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) ==
          chat["choices"][0]["message"]["content"] and chunks[-1]["choices"][0]["delta"] == {} and
          chunks[-1]["choices"][0]["finish_reason"] == "length" and
          all(c["object"] == "chat.completion.chunk" for c in chunks), chunks[:2])

    st, body, _ = srv.post("/v1/completions", {"prompt": "Hello", "max_tokens": 5, "n": 2, "logprobs": 2,
                                               "seed": 5, "ignore_eos": True})
    lp = body["choices"][0]["logprobs"] if st == 200 else {}
    check("completions: n = 2 choices with logprobs (tokens, token_logprobs, top_logprobs, text_offset)",
          st == 200 and [c["index"] for c in body["choices"]] == [0, 1] and
          len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5 and
          all(len(t) <= 2 and v <= 0 for t, v in zip(lp["top_logprobs"], lp["token_logprobs"])) and
          "".join(lp["tokens"]) == body["choices"][0]["text"] and body["usage"]["completion_tokens"] == 10, body)
    st, body, _ = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "logprobs": True,
                                                    "top_logprobs": 3, "ignore_eos": True})
    content = body["choices"][0]["logprobs"]["content"] if st == 200 else []
    check("chat: logprobs.content entries with token, logprob, bytes and 3 top_logprobs",
          len(content) == 4 and all(set(c) == {"token", "logprob", "bytes", "top_logprobs"} and
                                    len(c["top_logprobs"]) == 3 for c in content), body)
    st, body, _ = srv.post("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0,
                                               "ignore_eos": True, "echo": True})
    check("completions: echo puts the prompt before the text",
          st == 200 and completion_text(body) == "The quick brown fox" + greedy, body)
    # echo with logprobs scores the prompt too: each prompt token's log-probability (the first has
    # none) equals `hybridlm score`'s (a separate path: Engine::prefill with every position's logits),
    # and a cached prefix is not used for it. Streamed, the echo chunk carries them.
    ids = [5, 17, 300, 42, 9, 77, 1000, 3]
    srv.post("/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0})  # now cached
    st, body, _ = srv.post("/v1/completions", {"prompt": ids, "max_tokens": 2, "temperature": 0, "ignore_eos": True,
                                               "echo": True, "logprobs": 2})
    rc, out, err = run("score", "-m", hybrid, "--ids", ",".join(map(str, ids)), "--quiet", "-t", "2")
    want = [json.loads(x)["logprob"] for x in out.splitlines() if '"position"' in x] if rc == 0 else []
    lp = body["choices"][0]["logprobs"] if st == 200 else {}
    got = lp.get("token_logprobs", [])
    check("completions: echo + logprobs gives each prompt token's logprob as `hybridlm score` (first null)",
          len(got) == len(ids) + 2 and got[0] is None and lp["top_logprobs"][0] is None and len(want) == 7 and
          all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(got[1:8], want)) and
          all(len(t) == 2 for t in lp["top_logprobs"][1:]) and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
          (body, want, err[-200:]))
    st, _, events = srv.stream("/v1/completions", {"prompt": ids, "max_tokens": 2, "temperature": 0,
                                                   "ignore_eos": True, "echo": True, "logprobs": 2, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    first = chunks[0]["choices"][0] if chunks else {}
    check("completions stream: echo + logprobs, the echo chunk carries the prompt's logprobs",
          st == 200 and first.get("logprobs") is not None and first["logprobs"]["token_logprobs"][1:] == got[1:8] and
          len([c for c in chunks if c["choices"] and c["choices"][0]["text"]]) >= 1, chunks[:2])
    # A stop string taken from the middle of the greedy text: the answer ends before it.
    words = greedy.split()
    stop = words[len(words) // 2] if len(words) > 2 else None
    if stop:
        st, body, _ = srv.post("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 12,
                                                   "temperature": 0, "ignore_eos": True, "stop": [stop, "@@@"]})
        check("completions: a stop string ends the text before it, finish_reason stop",
              st == 200 and completion_text(body) == greedy[:greedy.index(stop)] and
              body["choices"][0]["finish_reason"] == "stop", (body, stop, greedy))
    st, metrics, _ = srv.get("/metrics")
    check("GET /metrics: Prometheus text with requests, tokens, slots, KV pages, prefix cache and latency histograms",
          st == 200 and all(n in metrics for n in (
              'hybridlm_requests_total{status="200"}', "hybridlm_prompt_tokens_total", "hybridlm_generated_tokens_total",
              "hybridlm_queue_depth", "hybridlm_slots_in_use", "hybridlm_kv_pages_in_use",
              "hybridlm_prefix_cache_hits_total", "hybridlm_prefix_cache_reused_tokens_total",
              "hybridlm_time_to_first_token_seconds_bucket", "hybridlm_inter_token_latency_seconds_count")),
          str(metrics)[:300])

    # ---- 16 clients at once == the same requests one by one ----
    reqs = [{"prompt": f"Request number {i}: " + "abc " * (i * 7), "max_tokens": 8 + i % 4, "seed": 100 + i,
             "temperature": 0.9, "ignore_eos": True} for i in range(16)]
    alone = [completion_text(srv.post("/v1/completions", r)[1]) for r in reqs]
    together = [None] * 16

    def worker(i):
        together[i] = completion_text(srv.post("/v1/completions", reqs[i])[1])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    check("16 concurrent clients with fixed seeds get the texts of the same requests one by one",
          None not in alone and together == alone, list(zip(alone, together))[:3])

    # ---- bad requests: 4xx, OpenAI's error shape naming the field, and the server goes on ----
    def bad(name, body, status, param, raw=None, path="/v1/completions"):
        st, resp, _ = srv.request("POST", path, raw if raw is not None else body)
        err = resp.get("error", {}) if isinstance(resp, dict) else {}
        check(f"bad request: {name} -> {status}, error names {param}",
              st == status and set(err) == {"message", "type", "param", "code"} and
              (param is None or err["param"] == param or param in err["message"]), (st, resp))

    bad("malformed JSON", None, 400, None, raw=b'{"prompt": "x", ')
    bad("max_tokens of the wrong type", {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens")
    bad("temperature out of range", {"prompt": "x", "temperature": 7}, 400, "temperature")
    bad("unknown model", {"model": "gpt-9", "prompt": "x"}, 404, "model")
    bad("negative max_tokens", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens")
    bad("huge max_tokens", {"prompt": "x", "max_tokens": 10 ** 12}, 400, "max_tokens")
    bad("max_tokens past the context", {"prompt": "x", "max_tokens": 100000}, 400, "max_tokens")
    bad("empty messages", {"messages": []}, 400, "messages", path="/v1/chat/completions")
    bad("an unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role",
        path="/v1/chat/completions")
    bad("content of the wrong type", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content",
        path="/v1/chat/completions")
    bad("invalid UTF-8", None, 400, None, raw=b'{"prompt": "\xff\xfe"}')
    bad("a number beyond double's range", None, 400, None, raw=b'{"prompt": "x", "max_tokens": 1e309}')
    bad("a body that is not an object", None, 400, None, raw=b'[1, 2]')
    bad("missing prompt", {"max_tokens": 3}, 400, "prompt")
    bad("n of 0", {"prompt": "x", "n": 0}, 400, "n")
    bad("stream_options without stream", {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
        "stream_options")
    bad("a token id beyond the vocabulary", {"prompt": [1, 2, 99999999]}, 400, "prompt")
    bad("an oversized body", None, 413, None, raw=b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
    bad("n above --slots", {"prompt": "x", "n": 5}, 400, "n")
    bad("a content part whose type is not a string", {"messages": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]},
        400, "messages[0].content[0]", path="/v1/chat/completions")
    bad("response_format with a null type", {"prompt": "x", "response_format": {"type": None}}, 400, "response_format")
    bad("max_completion_tokens past the context", {"messages": [{"role": "user", "content": "x"}],
                                                   "max_completion_tokens": 100000}, 400, "max_completion_tokens",
        path="/v1/chat/completions")
    # n choices that end at their first token (or before it) free their forks cleanly.
    for n, mt in ((2, 1), (3, 0), (4, 1)):
        st, body, _ = srv.post("/v1/completions", {"prompt": "Hello", "n": n, "max_tokens": mt, "ignore_eos": True})
        check(f"n = {n} with max_tokens {mt}: {n} choices of {mt} token(s), finish_reason length",
              st == 200 and len(body["choices"]) == n and body["usage"]["completion_tokens"] == n * mt and
              all(c["finish_reason"] == "length" for c in body["choices"]), body)
    st, resp, _ = srv.get("/v1/nothing")
    check("an unknown endpoint: 404 with an error body", st == 404 and "error" in resp, resp)
    # A prompt longer than the context, on a server with a small one.
    small = Server(hybrid, "-c", "64", "--slots", "1")
    st, resp, _ = small.post("/v1/completions", {"prompt": "word " * 200, "max_tokens": 1})
    check("a prompt longer than --ctx-size: 400 context_length_exceeded naming prompt",
          st == 400 and resp["error"]["code"] == "context_length_exceeded" and resp["error"]["param"] == "prompt",
          resp)
    small.stop()

    # A client that disconnects mid-stream: its slot is free again at the next step.
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    body = json.dumps({"prompt": "Once", "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(body)).encode() + b"\r\n\r\n" + body)
    got = s.recv(4096)
    s.close()
    freed = False
    for _ in range(100):
        m = srv.get("/metrics")[1]
        if re.search(r"^hybridlm_slots_in_use 0$", m, re.M):
            freed = True
            break
        time.sleep(0.1)
    check("a client that disconnects mid-stream frees its slot", b"200 OK" in got and freed, got[:100])
    st, body, _ = srv.post("/v1/completions", {"prompt": "still", "max_tokens": 3})
    check("the server keeps serving after every bad request", st == 200 and body["usage"]["completion_tokens"] >= 1)

    # ---- chat templates: the model's own (Qwen3's here) renders the prompt, as @huggingface/jinja does ----
    here = os.path.dirname(os.path.abspath(__file__))
    templates = os.path.join(here, "..", "data", "chat_templates")
    tmpl_model = os.path.join(scratch, "templated")
    shutil.copytree(hybrid, tmpl_model)
    with open(os.path.join(templates, "qwen3.jinja"), encoding="utf-8") as f:
        qwen3 = f.read()
    with open(os.path.join(tmpl_model, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"chat_template": qwen3, "eos_token": "<|endoftext|>"}, f)
    mistral_model = os.path.join(scratch, "mistral_templated")
    shutil.copytree(hybrid, mistral_model)
    with open(os.path.join(templates, "mistral-7b-instruct-v0.1.jinja"), encoding="utf-8") as f:
        json.dump({"chat_template": f.read(), "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
                  open(os.path.join(mistral_model, "tokenizer_config.json"), "w", encoding="utf-8"))
    tsrv = Server(tmpl_model)
    check("serve: a model with a chat template says so", "the model's chat template" in "".join(tsrv.log),
          "".join(tsrv.log)[-300:])
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": [{"type": "text", "text": "Why?"}]}]
    st, resp, _ = tsrv.post("/v1/chat/completions", {"messages": conv, "max_tokens": 2})
    js = ("import { createRequire } from 'node:module'; import { pathToFileURL } from 'node:url';"
          "const req = createRequire(process.argv[1] + '/package.json');"
          "const { Template } = await import(pathToFileURL(req.resolve('@huggingface/jinja')).href);"
          "const ctx = JSON.parse(process.argv[3]);"
          "process.stdout.write(new Template(process.argv[2]).render(ctx));")
    conv_js = [dict(m, content="Why?") if isinstance(m["content"], list) else m for m in conv]
    p = subprocess.run([shutil.which("node"), "--input-type=module", "-e", js, os.path.join(here, "..", "chat"), qwen3,
                        json.dumps({"messages": conv_js, "add_generation_prompt": True, "bos_token": None,
                                    "eos_token": "<|endoftext|>"})], capture_output=True, text=True, timeout=60)
    rendered = p.stdout
    rc, ids, _ = run("tokenize", "-m", tmpl_model, "-p", rendered)
    ids = ids if rc == 0 else "[]"
    check("chat with a template: the prompt is the template's rendering (@huggingface/jinja), tokenized without BOS",
          st == 200 and p.returncode == 0 and rendered.startswith("<|im_start|>system") and
          resp["usage"]["prompt_tokens"] == len(json.loads(ids)), (st, resp, p.stderr[-300:], rendered[:200]))
    tsrv.stop()
    msrv = Server(mistral_model)
    st, resp, _ = msrv.post("/v1/chat/completions", {"messages": [{"role": "system", "content": "x"},
                                                                  {"role": "user", "content": "y"}], "max_tokens": 2})
    check("chat: a message the template refuses (raise_exception) is a 400 naming messages, with its message",
          st == 400 and resp["error"]["param"] == "messages" and "alternate" in resp["error"]["message"].lower(), resp)
    msrv.stop()

    # ---- the official openai npm client ----
    client_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server")
    node = shutil.which("node")
    p = subprocess.run([node, os.path.join(client_dir, "openai_client.mjs"), f"http://127.0.0.1:{srv.port}/v1"],
                       capture_output=True, text=True, timeout=300)
    lines = [l for l in p.stdout.splitlines() if l.startswith(("PASS", "FAIL"))]
    check("the openai npm client: every call of tests/server/openai_client.mjs works",
          p.returncode == 0 and lines and all(l.startswith("PASS") for l in lines), (p.stdout[-800:], p.stderr[-800:]))
    for l in lines:
        print("  client: " + l)
    srv.stop()

    # ---- prefix reuse: a second request sharing a 1,000-token prefix, on a pure SSM and a hybrid ----
    for name, model in (("pure SSM", ssm), ("hybrid", hybrid)):
        warm = Server(model, "--slots", "2", "--snapshot-interval", "256")
        cold = Server(model, "--slots", "2", "--prefix-cache-mb", "0")
        shared = [(i * 37 + 11) % 500 for i in range(1000)]
        first = {"prompt": shared + [7, 8, 9], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        second = {"prompt": shared + [400, 401, 402, 403], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        warm.post("/v1/completions", first)
        st, w, _ = warm.post("/v1/completions", second)
        st2, c, _ = cold.post("/v1/completions", second)
        cached = w["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else -1
        m = warm.get("/metrics")[1]
        check(f"prefix reuse ({name}): the 1,000 shared tokens are restored from the snapshot at 768",
              cached == 768 and "hybridlm_prefix_cache_hits_total 1" in m and
              "hybridlm_prefix_cache_reused_tokens_total 768" in m, (cached, w))
        check(f"prefix reuse ({name}): the tokens of a cold run", st2 == 200 and completion_text(w) == completion_text(c) and
              c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, (completion_text(w), completion_text(c)))
        # A multi-turn chat: the second turn restores the first (its prompt at least).
        turn1 = [{"role": "user", "content": "Tell me about the sea."}]
        st, a1, _ = warm.post("/v1/chat/completions", {"messages": turn1, "max_tokens": 6, "ignore_eos": True})
        turn2 = turn1 + [a1["choices"][0]["message"], {"role": "user", "content": "And the sky?"}]
        st, a2, _ = warm.post("/v1/chat/completions", {"messages": turn2, "max_tokens": 6, "ignore_eos": True})
        check(f"prefix reuse ({name}): a chat's second turn reuses the first turn",
              st == 200 and a2["usage"]["prompt_tokens_details"]["cached_tokens"] >= a1["usage"]["prompt_tokens"],
              (a1["usage"], a2["usage"]))
        warm.stop()
        cold.stop()

    # ---- admission: N slots, N + M requests all finish; a full queue answers 503 ----
    adm = Server(hybrid, "--slots", "2", "--max-queue", "8", "--memory", "256MiB", "--prefix-cache-mb", "8")
    results = [None] * 6

    def long_request(i):
        results[i] = adm.post("/v1/completions", {"prompt": f"{i}", "max_tokens": 40, "ignore_eos": True})[0]

    threads = [threading.Thread(target=long_request, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    peak_rss = 0
    while any(t.is_alive() for t in threads):
        with open(f"/proc/{adm.proc.pid}/status") as f:
            rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) * 1024
        peak_rss = max(peak_rss, rss)
        time.sleep(0.05)
    check("admission: 2 slots, 6 concurrent requests all finish (queued)", results == [200] * 6, results)
    check(f"admission: resident memory stays under --memory 256MiB (peak {peak_rss >> 20} MiB)",
          0 < peak_rss < 256 << 20, peak_rss)
    adm.stop()
    full = Server(hybrid, "--slots", "1", "--max-queue", "0")
    codes, retry = [], []

    def one(i):
        st, _, h = full.post("/v1/completions", {"prompt": "x", "max_tokens": 300, "ignore_eos": True})
        codes.append(st)
        retry.append(h.get("Retry-After"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    check("admission: a full queue answers 503 with Retry-After", 200 in codes and 503 in codes and
          "1" in retry, codes)
    full.stop()

    # ---- the API key ----
    keyed = Server(hybrid, "--api-key", "s3cret")
    check("--api-key: /health needs no key", keyed.get("/health")[0] == 200)
    st, resp, _ = keyed.get("/v1/models")
    check("--api-key: no key is 401 with an error body", st == 401 and resp["error"]["code"] == "invalid_api_key", resp)
    st, _, _ = keyed.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
    check("--api-key: a wrong key is 401", st == 401)
    st, _, _ = keyed.request("GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})
    check("--api-key: the key is accepted", st == 200)
    keyed.stop()
    rc, _, err = run("serve", "-m", hybrid, "--port", "70000")
    check("serve: a port out of range is a one-line error", rc == 1 and "--port" in err, err)
finally:
    for s in servers:
        if s.proc.poll() is None:
            s.proc.kill()
finish()
