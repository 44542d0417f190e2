// The official OpenAI client (npm `openai`, pinned in package.json) against `hybridlm serve`:
// node openai_client.mjs BASE_URL. Prints a PASS/FAIL line per call; exits 1 if any failed.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0, timeout: 120_000 });
let failed = 0;
function check(name, ok, detail) {
  if (!ok) failed++;
  console.log(`${ok ? "PASS" : "FAIL"} ${name}${ok ? "" : "  " + JSON.stringify(detail)}`);
}

async function attempt(name, fn) {
  try {
    await fn();
  } catch (e) {
    check(name, false, String(e));
  }
}

// The model is named as the server lists it, as a client picking from /v1/models would.
let model = "";
await attempt("models.list", async () => {
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  check("models.list", models.length === 1 && typeof models[0].id === "string", models);
  model = models[0].id;
});

await attempt("completions.create", async () => {
  const r = await client.completions.create({ model, prompt: "Hello", max_tokens: 6, temperature: 0 });
  check("completions.create", typeof r.choices[0].text === "string" && r.usage.total_tokens > 0, r);
});

await attempt("completions.create stream", async () => {
  const stream = await client.completions.create({ model, prompt: "Hello", max_tokens: 6, temperature: 0, stream: true });
  let text = "", finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.text ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  const whole = await client.completions.create({ model, prompt: "Hello", max_tokens: 6, temperature: 0 });
  check("completions.create stream", text === whole.choices[0].text && finish !== null, { text, whole: whole.choices[0].text });
});

const messages = [
  { role: "system", content: "Answer briefly." },
  { role: "user", content: "What is the sea?" },
];

await attempt("chat.completions.create", async () => {
  const r = await client.chat.completions.create({ model, messages, max_completion_tokens: 8, seed: 3 });
  check("chat.completions.create", r.choices[0].message.role === "assistant" && typeof r.choices[0].message.content === "string" &&
    r.object === "chat.completion", r);
});

await attempt("chat.completions.create stream with usage", async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 8, seed: 3, stream: true, stream_options: { include_usage: true },
  });
  let text = "", usage = null, role = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      text += chunk.choices[0].delta.content ?? "";
      role = chunk.choices[0].delta.role ?? role;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 8, seed: 3 });
  check("chat.completions.create stream with usage", role === "assistant" && text === whole.choices[0].message.content &&
    usage && usage.completion_tokens > 0, { text, usage });
});

await attempt("chat.completions.stream helper", async () => {
  const runner = client.chat.completions.stream({ model, messages, max_tokens: 5 });
  const final = await runner.finalChatCompletion();
  check("chat.completions.stream helper", final.choices[0].message.role === "assistant" && final.choices[0].finish_reason, final);
});

await attempt("BadRequestError", async () => {
  try {
    await client.chat.completions.create({ model, messages: [], max_tokens: 5 });
    check("BadRequestError", false, "no error");
  } catch (e) {
    check("BadRequestError", e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "messages", {
      status: e.status, param: e.param, message: e.message,
    });
  }
});

await attempt("NotFoundError", async () => {
  try {
    await client.models.retrieve("no-such-model");
    check("NotFoundError", false, "no error");
  } catch (e) {
    check("NotFoundError", e instanceof OpenAI.NotFoundError && e.status === 404, { status: e.status, message: e.message });
  }
});

process.exit(failed ? 1 : 0);
