// Cross-check: our C++ tokenizer against the pure-JavaScript reference `@huggingface/tokenizers`
// (version pinned in package.json), id for id, on the real byte-level tokenizer files, then on the
// SentencePiece-style Llama-2 file and Metaspace variants of it (ids, decode, streaming).
//
// usage: node compare.mjs <path to tokenize_dump> <test data dir (tests/data)>
// Exit 0 when every case gives identical ids (and our decode(encode(s)) round-trips); exit 1 with
// the first differing case otherwise, or when the reference or the data is missing.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function fail(message) {
  console.error(`tokenizer_vs_hf_js: FAIL: ${message}`);
  process.exit(1);
}

if (process.argv.length !== 4) fail("usage: node compare.mjs <tokenize_dump> <test data dir (tests/data)>");
const [dumpTool, dataDir] = process.argv.slice(2);

let Tokenizer;
try {
  ({ Tokenizer } = await import("@huggingface/tokenizers"));
} catch (e) {
  fail(`cannot load @huggingface/tokenizers from ${here}/node_modules (${e.message}); ` +
       "run `npm install` in tests/tokenizer (scripts/setup.sh does it)");
}
if (!fs.existsSync(dumpTool)) fail(`dump tool ${dumpTool} does not exist (build target tokenize_dump)`);

const tokenizers = ["gpt-neox-20b", "llama3"].map((name) => path.join(dataDir, "tokenizers", name));
const corpus = path.join(dataDir, "corpora", "tinyshakespeare.txt");
for (const p of [...tokenizers.map((d) => path.join(d, "tokenizer.json")), corpus]) {
  if (!fs.existsSync(p)) fail(`missing test data ${p}`);
}

// Cases: the hand-written strings, then Shakespeare: the first 200 lines as one block, a few
// single lines, and the whole corpus (about 1 MB) as one string.
const cases = JSON.parse(fs.readFileSync(path.join(here, "cases.json"), "utf8"));
const shakespeare = fs.readFileSync(corpus, "utf8");
const lines = shakespeare.split("\n");
cases.push(lines.slice(0, 200).join("\n"));
for (const i of [0, 1, 9, 33, 100, 150, 199, 1000, 5000]) cases.push(lines[i]);
cases.push(lines.slice(2000, 2040).join("\n") + "\n");
cases.push(shakespeare);

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tokcmp-"));
const casesFile = path.join(tmp, "cases.json");
fs.writeFileSync(casesFile, JSON.stringify(cases));

const show = (s) => JSON.stringify(s.length > 300 ? s.slice(0, 300) + "…" : s);

let total = 0;
for (const dir of tokenizers) {
  const tokJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const configPath = path.join(dir, "tokenizer_config.json");
  const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
  const reference = new Tokenizer(tokJson, config);
  const hasNfc = JSON.stringify(tokJson.normalizer ?? null).includes('"NFC"');

  const t0 = Date.now();
  let ours;
  try {
    ours = JSON.parse(execFileSync(dumpTool, [dir, casesFile], { maxBuffer: 1 << 30, encoding: "utf8" }));
  } catch (e) {
    fail(`${dumpTool} failed on ${dir}: ${e.stderr || e.message}`);
  }
  const oursMs = Date.now() - t0;
  if (ours.length !== cases.length) fail(`${dir}: dump tool returned ${ours.length} results for ${cases.length} cases`);

  for (let i = 0; i < cases.length; ++i) {
    const text = cases[i];
    const expected = reference.encode(text, { add_special_tokens: true }).ids;
    const got = ours[i].ids;
    const same = expected.length === got.length && expected.every((id, k) => id === got[k]);
    if (!same) {
      let k = 0;
      while (k < expected.length && k < got.length && expected[k] === got[k]) ++k;
      const near = (ids) => JSON.stringify(ids.slice(Math.max(0, k - 3), k + 5));
      fail(`${path.basename(dir)}: case ${i} ${show(text)}\n` +
           `  first difference at position ${k} (reference has ${expected.length} ids, ours ${got.length})\n` +
           `  reference ${near(expected)} = ${JSON.stringify(expected.slice(Math.max(0, k - 3), k + 5).map((id) => reference.id_to_token(id)))}\n` +
           `  ours      ${near(got)} = ${JSON.stringify(got.slice(Math.max(0, k - 3), k + 5).map((id) => reference.id_to_token(id)))}`);
    }
    // Round trip on our side: decode(encode(s)) is s, normalized when the tokenizer normalizes.
    const want = hasNfc ? text.normalize("NFC") : text;
    if (ours[i].decoded !== want) {
      fail(`${path.basename(dir)}: case ${i} ${show(text)} does not round-trip: decoded ${show(ours[i].decoded)}`);
    }
  }
  total += cases.length;
  console.log(`${path.basename(dir)}: ${cases.length} cases identical to @huggingface/tokenizers ` +
              `(our dump tool: ${oursMs} ms including load)`);
}
// SentencePiece-style tokenizer.json files: Llama-2 as published (normalizer Prepend + Replace,
// BPE with byte_fallback, decoder Replace/ByteFallback/Fuse/Strip), and variants of it built here
// in the other published form (no normalizer; Metaspace pre-tokenizer and decoder), with
// prepend_scheme "first" and "always" and split false and true. The reference ignores Metaspace's
// "split" (the Rust crate splits before each "▁"), so for split true the reference is given that
// split as a pre-tokenizer it does implement: a Split keeping the matches of "▁[^▁]*|[^▁]+".
// Checked: ids, the decode of those ids (special tokens kept), and, on random id sequences, our
// decode and our StreamDecoder against the reference's decode (special tokens kept and skipped).
const spCases = [...JSON.parse(fs.readFileSync(path.join(here, "cases.json"), "utf8")),
                 ...JSON.parse(fs.readFileSync(path.join(here, "cases_sentencepiece.json"), "utf8")),
                 lines.slice(0, 400).join("\n"), ...[0, 1, 9, 33, 100].map((i) => lines[i])];
const spCasesFile = path.join(tmp, "sp_cases.json");
fs.writeFileSync(spCasesFile, JSON.stringify(spCases));
const llama2Dir = path.join(dataDir, "tokenizers", "llama2");
if (!fs.existsSync(path.join(llama2Dir, "tokenizer.json"))) fail(`missing test data ${llama2Dir}/tokenizer.json`);
const llama2 = JSON.parse(fs.readFileSync(path.join(llama2Dir, "tokenizer.json"), "utf8"));
const llama2Config = JSON.parse(fs.readFileSync(path.join(llama2Dir, "tokenizer_config.json"), "utf8"));
const variants = [{ name: "llama2", ours: llama2, reference: llama2 }];
for (const scheme of ["first", "always"]) {
  for (const split of [false, true]) {
    const metaspace = { type: "Metaspace", replacement: "\u2581", prepend_scheme: scheme, split };
    const ours = { ...llama2, normalizer: null, pre_tokenizer: metaspace,
                   decoder: { type: "Metaspace", replacement: "\u2581", prepend_scheme: scheme, split } };
    const reference = !split ? ours : {
      ...ours,
      pre_tokenizer: { type: "Sequence", pretokenizers: [
        { ...metaspace, split: false },
        { type: "Split", pattern: { Regex: "\u2581[^\u2581]*|[^\u2581]+" }, behavior: "Isolated", invert: true }] },
    };
    variants.push({ name: `llama2-metaspace-${scheme}${split ? "-split" : ""}`, ours, reference });
  }
}

// Random id sequences, weighted towards what makes decoding hard: byte tokens (ids 3..258 are
// <0x00>..<0xFF>), the special tokens 0..2, and "▁"-only tokens.
let seed = 12345;
const random = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const spaceIds = ["\u2581", "\u2581\u2581", "\u2581\u2581\u2581\u2581"].map((t) => llama2.model.vocab[t]);
const idLists = [];
for (let n = 0; n < 400; ++n) {
  const ids = [];
  const len = 1 + Math.floor(random() * 12);
  for (let k = 0; k < len; ++k) {
    const r = random();
    if (r < 0.45) ids.push(3 + 0x80 + Math.floor(random() * 0x80));       // a non-ASCII byte
    else if (r < 0.55) ids.push(3 + Math.floor(random() * 0x80));         // an ASCII byte
    else if (r < 0.62) ids.push(Math.floor(random() * 3));                // <unk> <s> </s>
    else if (r < 0.72) ids.push(spaceIds[Math.floor(random() * 3)]);
    else ids.push(259 + Math.floor(random() * (32000 - 259)));
  }
  idLists.push(ids);
}
// Whole characters spelled in byte tokens, alone and around words (what generation produces).
const bytesOf = (s) => [...new TextEncoder().encode(s)].map((b) => 3 + b);
idLists.push(bytesOf("中"), [...bytesOf("😀"), 15043], [15043, ...bytesOf("😀")], [29871, ...bytesOf("é")],
             [1, ...bytesOf(" x")], [...bytesOf("\xF0\x9F"), 15043].slice(0, 3));
const idListsFile = path.join(tmp, "id_lists.json");
fs.writeFileSync(idListsFile, JSON.stringify(idLists));

const noCleanup = { skip_special_tokens: false, clean_up_tokenization_spaces: false };
for (const v of variants) {
  const dir = path.join(tmp, v.name);
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(v.ours));
  fs.copyFileSync(path.join(llama2Dir, "tokenizer_config.json"), path.join(dir, "tokenizer_config.json"));
  const reference = new Tokenizer(v.reference, llama2Config);
  const run = (args) => {
    try {
      return JSON.parse(execFileSync(dumpTool, args, { maxBuffer: 1 << 30, encoding: "utf8" }));
    } catch (e) {
      fail(`${dumpTool} failed on ${dir}: ${e.stderr || e.message}`);
    }
  };
  const ours = run([dir, spCasesFile]);
  for (let i = 0; i < spCases.length; ++i) {
    const text = spCases[i];
    const expected = reference.encode(text, { add_special_tokens: true }).ids;
    const got = ours[i].ids;
    if (expected.length !== got.length || !expected.every((id, k) => id === got[k])) {
      let k = 0;
      while (k < expected.length && k < got.length && expected[k] === got[k]) ++k;
      const near = (ids) => JSON.stringify(ids.slice(Math.max(0, k - 3), k + 5).map((id) => reference.id_to_token(id)));
      fail(`${v.name}: case ${i} ${show(text)}\n  first difference at position ${k} ` +
           `(reference has ${expected.length} ids, ours ${got.length})\n  reference ${near(expected)}\n  ours      ${near(got)}`);
    }
    const want = expected.length ? reference.decode(expected, noCleanup) : "";
    if (ours[i].decoded_ids !== want) {
      fail(`${v.name}: case ${i} ${show(text)}: decode ${show(ours[i].decoded_ids)}, reference ${show(want)}`);
    }
  }
  const decoded = run(["--decode", dir, idListsFile]);
  for (let i = 0; i < idLists.length; ++i) {
    const ids = idLists[i];
    const want = reference.decode(ids, noCleanup);
    const wantSkip = ids.some((id) => id > 2) ? reference.decode(ids, { ...noCleanup, skip_special_tokens: true }) : "";
    const d = decoded[i];
    for (const [what, got, expected] of [["decode", d.decoded, want], ["stream", d.streamed, want],
                                         ["decode (skip special)", d.decoded_skip, wantSkip],
                                         ["stream (skip special)", d.streamed_skip, wantSkip]]) {
      if (got !== expected) {
        fail(`${v.name}: ${what} of ids ${JSON.stringify(ids)} = ${show(got)}, reference ${show(expected)}`);
      }
    }
  }
  total += spCases.length;
  console.log(`${v.name}: ${spCases.length} cases identical to @huggingface/tokenizers (ids and decode); ` +
              `${idLists.length} random id sequences decode and stream identically`);
}

fs.rmSync(tmp, { recursive: true, force: true });
console.log(`tokenizer_vs_hf_js: OK, ${total} encodings identical`);
