// llama.cpp's prefill and decode tokens/s through npm's node-llama-cpp (its prebuilt CPU
// libraries), for the side-by-side rows in docs/benchmarks.md where no llama.cpp build of our own
// is at hand. llama-bench's tests on a GGUF file: pp P (one prompt of P random tokens, one
// evaluation) and tg N @ dD (N greedy decode steps after a context of D random tokens, the
// context's prefill untimed; its rate is printed too). Weights read into memory (no mmap), CPU
// only, the KV cache in bf16 as ours by default (--kv f16: llama.cpp's default), flash attention
// "auto" (llama.cpp decides; --fa on|off), batches of 512 tokens (-b).
//
// node-llama-cpp is not a dependency of this project: install it where you like and point
// NODE_PATH-style resolution at it with --lib (the folder that holds node_modules):
//   mkdir -p /tmp/nlc && (cd /tmp/nlc && npm i -E node-llama-cpp@3.21.1)
//   node bench/llamacpp_node_bench.mjs --lib /tmp/nlc -m M.gguf [-t 2] [-p 512,8192] [-n 32]
//        [-d 0,16384] [-r 1] [--kv bf16|f16] [--fa auto|on|off] [-b 512]
// Prints one JSON line per test: {"test", "n_prompt", "n_gen", "n_depth", "tokens_per_second",
// "depth_prefill_tokens_per_second"}, and the llama.cpp commit of the library first.
import {createRequire} from "node:module";
import path from "node:path";

const args = process.argv.slice(2);
const opt = {lib: null, model: null, threads: 2, prompts: "512", gens: "32", depths: "0", reps: 1, kv: "BF16", fa: "auto",
             batch: 512};
for (let i = 0; i < args.length; ++i) {
  const a = args[i], v = args[i + 1];
  if (a === "--lib") opt.lib = v;
  else if (a === "-m") opt.model = v;
  else if (a === "-t") opt.threads = Number(v);
  else if (a === "-p") opt.prompts = v;
  else if (a === "-n") opt.gens = v;
  else if (a === "-d") opt.depths = v;
  else if (a === "-r") opt.reps = Number(v);
  else if (a === "--kv") opt.kv = v.toUpperCase();
  else if (a === "--fa") opt.fa = v === "auto" ? "auto" : v === "on";
  else if (a === "-b") opt.batch = Number(v);
  else {
    console.error(`llamacpp_node_bench: unknown argument ${a}`);
    process.exit(1);
  }
  ++i;
}
if (!opt.lib || !opt.model) {
  console.error("usage: node bench/llamacpp_node_bench.mjs --lib DIR -m M.gguf [-t 2] [-p 512] [-n 32] [-d 0] [-r 1] " +
                "[--kv bf16|f16] [--fa auto|on|off] [-b 512]");
  process.exit(1);
}
const list = (s) => s.split(",").map(Number).filter((x) => x > 0);
const require = createRequire(path.join(path.resolve(opt.lib), "package.json"));
const entry = require.resolve("node-llama-cpp");
const {getLlama} = await import(entry);
const info = path.join(path.dirname(entry), "..", "llama", "gitRelease.bundle");
let commit = "unknown";
try {
  const {execFileSync} = await import("node:child_process");
  commit = execFileSync("git", ["bundle", "list-heads", info]).toString().split(" ")[0];
} catch {}
console.log(JSON.stringify({llama_cpp_commit: commit, library: "node-llama-cpp (prebuilt CPU libraries)"}));

const llama = await getLlama({gpu: false, build: "never", logLevel: "error", maxThreads: opt.threads});
const model = await llama.loadModel({modelPath: opt.model, gpuLayers: 0, useMmap: false});
let seed = 1;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648), seed);
const randomTokens = (n) => Array.from({length: n}, () => 10 + (rand() % 20000));  // ids any vocabulary here has
const maxDepth = Math.max(0, ...list(opt.depths));
const contextSize = Math.max(maxDepth, ...list(opt.prompts)) + Math.max(...list(opt.gens), 1) + 64;
const context = await model.createContext({contextSize, threads: {ideal: opt.threads, min: opt.threads},
                                           batchSize: opt.batch, sequences: 1, flashAttention: opt.fa,
                                           experimentalKvCacheKeyType: opt.kv,
                                           experimentalKvCacheValueType: opt.kv});
const seq = context.getSequence();
const now = () => Number(process.hrtime.bigint()) / 1e9;

for (const p of list(opt.prompts)) {
  const rates = [];
  for (let r = 0; r < opt.reps + 1; ++r) {
    await seq.clearHistory();
    const toks = randomTokens(p);
    const t0 = now();
    await seq.evaluateWithoutGeneratingNewTokens(toks);
    if (r > 0) rates.push(p / (now() - t0));
  }
  console.log(JSON.stringify({test: `pp${p}`, n_prompt: p, n_gen: 0, n_depth: 0,
                              tokens_per_second: rates.reduce((a, b) => a + b) / rates.length}));
}
for (const d of opt.depths.split(",").map(Number)) {
  for (const n of list(opt.gens)) {
    const rates = [], fills = [];
    for (let r = 0; r < opt.reps; ++r) {
      await seq.clearHistory();
      if (d > 0) {
        const t0 = now();
        await seq.evaluateWithoutGeneratingNewTokens(randomTokens(d));
        fills.push(d / (now() - t0));
      }
      let count = 0, t0 = 0;
      for await (const _ of seq.evaluate(randomTokens(1), {temperature: 0})) {
        if (count === 0) t0 = now();  // the first token comes from a one-token step like the rest
        if (++count > n) break;
      }
      rates.push(n / (now() - t0));
    }
    console.log(JSON.stringify({test: d > 0 ? `tg${n} @ d${d}` : `tg${n}`, n_prompt: 0, n_gen: n, n_depth: d,
                                tokens_per_second: rates.reduce((a, b) => a + b) / rates.length,
                                depth_prefill_tokens_per_second: fills.length ? fills.reduce((a, b) => a + b) / fills.length : null}));
  }
}
await context.dispose();
await model.dispose();
