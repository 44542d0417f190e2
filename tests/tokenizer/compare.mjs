// Cross-check: our C++ tokenizer against the pure-JavaScript reference `@huggingface/tokenizers`
// (version pinned in package.json), id for id, on both real tokenizer files.
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
fs.rmSync(tmp, { recursive: true, force: true });
console.log(`tokenizer_vs_hf_js: OK, ${total} encodings identical`);
