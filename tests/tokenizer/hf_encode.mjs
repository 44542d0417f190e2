// The JavaScript reference (@huggingface/tokenizers, pinned in package.json) on one tokenizer:
// prints, as one JSON array, {ids, decoded} for each string of a JSON array of strings.
// The CLI tests (tests/runtime/cli_data_test.py) compare these with `hybridlm tokenize`.
//
// usage: node hf_encode.mjs <dir with tokenizer.json> <cases.json>
// Exit 1 with one line on stderr when the reference or a file is missing.
import fs from "node:fs";
import path from "node:path";

function fail(message) {
  console.error(`hf_encode: ${message}`);
  process.exit(1);
}

if (process.argv.length !== 4) fail("usage: node hf_encode.mjs <tokenizer dir> <cases.json>");
const [dir, casesFile] = process.argv.slice(2);
let Tokenizer;
try {
  ({ Tokenizer } = await import("@huggingface/tokenizers"));
} catch (e) {
  fail(`cannot load @huggingface/tokenizers (${e.message}); run \`npm install\` in tests/tokenizer`);
}
const tokJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const configPath = path.join(dir, "tokenizer_config.json");
const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
const reference = new Tokenizer(tokJson, config);
const cases = JSON.parse(fs.readFileSync(casesFile, "utf8"));
const out = cases.map((text) => {
  const ids = reference.encode(text, { add_special_tokens: true }).ids;
  // The reference refuses to decode no ids.
  return { ids, decoded: ids.length ? reference.decode(ids, { skip_special_tokens: false }) : "" };
});
process.stdout.write(JSON.stringify(out));
