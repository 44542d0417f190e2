// Cross-check: our chat-template engine against the JavaScript reference `@huggingface/jinja`
// (version pinned in package.json), byte for byte, on real chat templates (tests/data/chat_templates)
// and on features.jinja, each with several conversations.
//
// usage: node compare.mjs <path to render_template> <test data dir (tests/data)>
// Exit 0 when every case renders identically (or both engines raise the same raise_exception
// message); exit 1 with the first differences otherwise, or when the reference or data is missing.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function fail(message) {
  console.error(`chat_template_vs_hf_js: FAIL: ${message}`);
  process.exit(1);
}

if (process.argv.length !== 4) fail("usage: node compare.mjs <render_template> <test data dir (tests/data)>");
const [renderTool, dataDir] = process.argv.slice(2);

let Template;
try {
  ({ Template } = await import("@huggingface/jinja"));
} catch (e) {
  fail(`cannot load @huggingface/jinja from ${here}/node_modules (${e.message}); ` +
       "run `npm install` in tests/chat (scripts/setup.sh does it)");
}
if (!fs.existsSync(renderTool)) fail(`render tool ${renderTool} does not exist (build target render_template)`);

// Templates and the special tokens their tokenizer_config.json defines (Qwen3 has no bos_token:
// it is left out, not passed as null, as transformers does).
const T = (file) => path.join(dataDir, "chat_templates", file);
const templates = [
  { name: "llama3", file: T("llama3.jinja"), tokens: { bos_token: "<|begin_of_text|>", eos_token: "<|end_of_text|>" } },
  { name: "qwen3", file: T("qwen3.jinja"), tokens: { eos_token: "<|im_end|>" } },
  { name: "nemotron-nano-v2", file: T("nemotron-nano-v2.jinja"), tokens: { bos_token: "<SPECIAL_1>", eos_token: "<SPECIAL_12>" } },
  { name: "lfm2", file: T("lfm2.jinja"), tokens: { bos_token: "<|startoftext|>", eos_token: "<|im_end|>" } },
  { name: "mistral-v0.1", file: T("mistral-7b-instruct-v0.1.jinja"), tokens: { bos_token: "<s>", eos_token: "</s>" } },
  { name: "features", file: path.join(here, "features.jinja"), tokens: { bos_token: "<s>", eos_token: "</s>" } },
];
for (const t of templates) if (!fs.existsSync(t.file)) fail(`missing test data ${t.file}`);

const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", description: "City name, e.g. Zürich" },
      unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["city"] } } },
  { type: "function", function: { name: "search", description: "Search the web for \"anything\"",
    parameters: { type: "object", properties: { q: { type: "string" }, n: { type: "integer" } }, required: ["q"] } } },
];
const sys = { role: "system", content: "You are a helpful assistant." };
const u = (content) => ({ role: "user", content });
const a = (content, extra = {}) => ({ role: "assistant", content, ...extra });
const call = (name, args, id) => ({ type: "function", id, function: { name, arguments: args } });

// [name, messages, extra variables]
const conversations = [
  ["user only", [u("Hello!")], {}],
  ["system + user", [sys, u("What is 2+2?")], {}],
  ["multi-turn", [sys, u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")], {}],
  ["ends with assistant", [u("Hi"), a("Hello there.")], {}],
  ["no system, alternating", [u("One"), a("Two"), u("Three"), a("Four"), u("Five")], {}],
  ["unicode and quotes", [sys, u("Grüße, 你好 🙂 \"quoted\" 'single' back\\slash </s> <|im_end|> {{ not a tag }}\nline2\ttab")], {}],
  ["whitespace content", [u("  padded \n\n"), a("\n answer \n"), u("ok")], {}],
  ["empty content", [u(""), a(""), u("again")], {}],
  ["tools", [sys, u("Weather in Paris?")], { tools }],
  ["tools, no system", [u("Weather in Paris?")], { tools }],
  ["tool call round", [sys, u("Weather in Paris?"),
    a("", { tool_calls: [call("get_weather", { city: "Paris", unit: "celsius" }, "call_1")] }),
    { role: "tool", content: "{\"temp\": 21}" }, u("Thanks!")], { tools }],
  ["two tool calls, two results", [u("Weather in Paris and Rome?"),
    a("Let me check.", { tool_calls: [call("get_weather", { city: "Paris" }, "c1"), call("get_weather", { city: "Rome" }, "c2")] }),
    { role: "tool", content: "sunny" }, { role: "tool", content: "rainy" }], { tools }],
  ["tool call, string arguments", [u("Search cats"),
    a("", { tool_calls: [call("search", "{\"q\": \"cats\", \"n\": 3}", "c9")] }), { role: "tool", content: "[]" }], { tools }],
  ["think in history", [u("2+2?"), a("<think>\nsimple sum\n</think>\n\n4"), u("3+3?")], {}],
  ["think, last assistant", [u("2+2?"), a("<think>\nadd\n</think>\n\nIt is 4.")], {}],
  ["reasoning_content", [u("2+2?"), a("4", { reasoning_content: "two plus two" }), u("and 3+3?")], {}],
  ["enable_thinking false", [u("Quick answer please")], { enable_thinking: false }],
  ["enable_thinking true", [u("Think hard")], { enable_thinking: true }],
  ["no_think switch", [{ role: "system", content: "Be brief. /no_think" }, u("Hi /think")], {}],
  ["system only", [sys], {}],
  ["roles do not alternate", [u("a"), u("b")], {}],
];

const cases = [];
for (const t of templates) {
  for (const [cname, messages, extra] of conversations) {
    for (const add_generation_prompt of [true, false]) {
      const context = { messages, add_generation_prompt, ...t.tokens, ...extra };
      cases.push({ name: `${t.name} / ${cname} / add_generation_prompt=${add_generation_prompt}`, template: t.file, context });
    }
  }
}

// The reference.
const compiled = new Map();
const reference = cases.map((c) => {
  try {
    if (!compiled.has(c.template)) compiled.set(c.template, new Template(fs.readFileSync(c.template, "utf8")));
    return { output: compiled.get(c.template).render(structuredClone(c.context)) };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
});

// Ours.
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "jinjacmp-"));
const casesFile = path.join(tmp, "cases.json");
fs.writeFileSync(casesFile, JSON.stringify(cases.map(({ template, context }) => ({ template, context }))));
let ours;
try {
  ours = JSON.parse(execFileSync(renderTool, [casesFile], { maxBuffer: 1 << 28, encoding: "utf8" }));
} catch (e) {
  fail(`render_template failed: ${e.message}`);
}
fs.rmSync(tmp, { recursive: true, force: true });
if (ours.length !== cases.length) fail(`render_template returned ${ours.length} results for ${cases.length} cases`);

// Cases where @huggingface/jinja departs from Jinja2 (what transformers renders with) and we
// follow Jinja2: these must differ in exactly the stated way.
const divergences = [
  { match: /^nemotron-nano-v2 \/ system only \//, ours: /'messages\[\.\.\.\]' is undefined/,
    why: "Jinja2 raises on an item of an undefined value (messages[-1]['role'] of an empty list); hf-jinja renders" },
  { match: /^features \/ unicode and quotes \//, ours: null,
    why: "length counts code points as Python does; hf-jinja counts UTF-16 units (the emoji counts 2)" },
];

const show = (s) => JSON.stringify(s.length > 200 ? s.slice(0, 200) + "…" : s);
let same = 0, bothRaise = 0, diverged = 0;
const problems = [];
for (let i = 0; i < cases.length; ++i) {
  const r = reference[i], o = ours[i];
  const d = divergences.find((x) => x.match.test(cases[i].name));
  if (d) {
    const differs = r.output !== o.output || r.error !== o.error;
    const shape = d.ours ? (o.error !== undefined && d.ours.test(o.error)) : o.output !== undefined;
    if (differs && shape) { ++diverged; continue; }
    problems.push(`${cases[i].name}: listed as a divergence (${d.why}) but ours gave ${JSON.stringify(o)}`);
    continue;
  }
  if (r.output !== undefined && o.output !== undefined) {
    if (r.output === o.output) { ++same; continue; }
    let k = 0;
    while (k < r.output.length && r.output[k] === o.output[k]) ++k;
    problems.push(`${cases[i].name}: outputs differ at char ${k}\n  hf-jinja: ${show(r.output.slice(Math.max(0, k - 60)))}\n  ours:     ${show(o.output.slice(Math.max(0, k - 60)))}`);
  } else if (r.error !== undefined && o.error !== undefined) {
    // Both raise: the template's raise_exception message must come through unchanged.
    if (o.error.endsWith(`: ${r.error}`)) { ++bothRaise; continue; }
    problems.push(`${cases[i].name}: both raise, messages differ\n  hf-jinja: ${r.error}\n  ours:     ${o.error}`);
  } else {
    problems.push(`${cases[i].name}: ${r.error !== undefined ? `hf-jinja raises "${r.error}"` : "hf-jinja renders"}, ` +
                  `${o.error !== undefined ? `ours raises "${o.error}"` : `ours renders ${show(o.output)}`}`);
  }
}
console.log(`chat_template_vs_hf_js: ${same} of ${cases.length} cases byte-identical, ${bothRaise} raise the same ` +
            `error in both, ${diverged} differ as documented (${templates.length} templates x ${conversations.length} ` +
            "conversations x add_generation_prompt)");
for (const d of divergences) console.log(`  documented divergence: ${d.why}`);
if (problems.length) {
  for (const p of problems.slice(0, 6)) console.error(p);
  fail(`${problems.length} of ${cases.length} cases differ`);
}
