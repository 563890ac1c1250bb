// gen_schemas.mjs - the JSON-schema fixture set of the structured-output
// tests: hand-written schemas (tool parameters, records, recursion through
// $ref) and generated ones (seeded: the same file every run), one per line.
//   node gen_schemas.mjs > ../../../tests/fixtures/structured/schemas.jsonl
// Every schema is checked here to compile with ajv, so that a fixture is
// never itself invalid.
import Ajv from "ajv/dist/2020.js";

const HAND = [
  {type: "object", properties: {location: {type: "string", description: "City"}, unit: {enum: ["celsius", "fahrenheit"]}},
   required: ["location"]},
  {type: "object", properties: {name: {type: "string", minLength: 1, maxLength: 40}, age: {type: "integer", minimum: 0, maximum: 150},
   email: {type: "string", format: "email"}}, required: ["name", "age"]},
  {type: "object", properties: {id: {type: "string", format: "uuid"}, created: {type: "string", format: "date-time"},
   tags: {type: "array", items: {type: "string", pattern: "^[a-z][a-z0-9-]{0,15}$"}, maxItems: 5}}, required: ["id", "created", "tags"]},
  {$defs: {node: {type: "object", properties: {value: {type: "integer"}, children: {type: "array", items: {$ref: "#/$defs/node"}, maxItems: 3}},
   required: ["value"]}}, $ref: "#/$defs/node"},
  {definitions: {item: {type: "object", properties: {sku: {type: "string", pattern: "^[A-Z]{3}-[0-9]{4}$"}, qty: {type: "integer", minimum: 1, maximum: 99},
   price: {type: "number", minimum: 0, exclusiveMaximum: 10000}}, required: ["sku", "qty", "price"], additionalProperties: false}},
   type: "object", properties: {order_id: {type: "integer", minimum: 1}, items: {type: "array", items: {$ref: "#/definitions/item"}, minItems: 1, maxItems: 4},
   status: {enum: ["pending", "shipped", "delivered"]}, note: {anyOf: [{type: "string", maxLength: 80}, {type: "null"}]}},
   required: ["order_id", "items", "status"]},
  {type: "object", properties: {query: {type: "string"}, filters: {type: "object", additionalProperties: {type: "string"}},
   limit: {type: "integer", minimum: 1, maximum: 50, default: 10}}, required: ["query"]},
  {type: "array", prefixItems: [{type: "number"}, {type: "number"}], items: false, minItems: 2},
  {oneOf: [{type: "object", properties: {kind: {const: "circle"}, r: {type: "number", minimum: 0}}, required: ["kind", "r"]},
           {type: "object", properties: {kind: {const: "rect"}, w: {type: "number"}, h: {type: "number"}}, required: ["kind", "w", "h"]}]},
  {allOf: [{type: "object", properties: {a: {type: "integer"}}, required: ["a"]}, {properties: {b: {type: "boolean"}}, required: ["b"]}]},
  {type: "object", properties: {date: {type: "string", format: "date"}, time: {type: "string", format: "time"},
   ip: {type: "string", format: "ipv4"}}, required: ["date", "time", "ip"]},
  {type: "object", properties: {matrix: {type: "array", items: {type: "array", items: {type: "integer", minimum: -9, maximum: 9}, minItems: 2, maxItems: 2},
   minItems: 2, maxItems: 2}}, required: ["matrix"]},
  {$defs: {list: {anyOf: [{type: "null"}, {type: "object", properties: {head: {type: "string", maxLength: 8}, tail: {$ref: "#/$defs/list"}},
   required: ["head", "tail"]}]}}, $ref: "#/$defs/list"},
  {type: "object", properties: {"with space": {type: "boolean"}, "quote\"key": {type: "null"}, "é中": {const: 3}}, required: ["with space", "é中"]},
  {type: ["object", "null"], properties: {x: {type: "number"}}},
  {type: "object", properties: {answer: {type: "string", enum: ["A", "B", "C", "D"]}, confidence: {type: "number", minimum: 0, maximum: 1},
   reasoning: {type: "string", maxLength: 200}}, required: ["answer", "confidence"], additionalProperties: false},
  {type: "object", properties: {steps: {type: "array", items: {type: "object", properties: {explanation: {type: "string"}, output: {type: "string"}},
   required: ["explanation", "output"], additionalProperties: false}}, final_answer: {type: "string"}}, required: ["steps", "final_answer"],
   additionalProperties: false},
  {type: "object", properties: {name: {type: "string"}, extra: {type: "object", additionalProperties: true}}, required: ["name", "extra"]},
  {type: "string", enum: ["positive", "negative", "neutral"]},
  {type: "integer", minimum: -1000000, maximum: 1000000},
  {type: "number"},
  {type: "object", properties: {v: {type: "number", minimum: -2.5, maximum: 7.25}, n: {type: "integer", exclusiveMinimum: -3, exclusiveMaximum: 3}},
   required: ["v", "n"]},
  {type: "object", properties: {t: {type: "string", minLength: 3, maxLength: 3}, u: {type: "string", minLength: 5}}, required: ["t", "u"]},
  {title: "Person", type: "object", properties: {first_name: {title: "First Name", type: "string"}, last_name: {title: "Last Name", type: "string"},
   address: {$ref: "#/$defs/Address"}}, required: ["first_name", "last_name", "address"],
   $defs: {Address: {title: "Address", type: "object", properties: {street: {type: "string"}, city: {type: "string"},
   zip: {type: "string", pattern: "^[0-9]{5}$"}}, required: ["street", "city", "zip"]}}},
  {type: "object", properties: {flag: {const: true}, items: {type: "array", items: {enum: [1, 2, 3]}, minItems: 3, maxItems: 3}},
   required: ["flag", "items"]},
  {anyOf: [{type: "integer", minimum: 0, maximum: 9}, {type: "string", pattern: "^[a-f]{2}$"}, {type: "boolean"}]},
  {type: "object", additionalProperties: {type: "integer", minimum: 0, maximum: 9}},
  {type: "array", items: {type: "object", properties: {k: {type: "string"}, v: {}}, required: ["k", "v"]}, maxItems: 3},
  {type: "object", properties: {nested: {type: "object", properties: {deeper: {type: "object", properties: {deepest: {type: "string", maxLength: 10}},
   required: ["deepest"]}}, required: ["deeper"]}}, required: ["nested"]},
  {type: "object", properties: {a: {type: "string"}, b: {type: "string"}, c: {type: "string"}, d: {type: "string"}, e: {type: "string"}}},
  {$defs: {expr: {oneOf: [{type: "integer", minimum: 0, maximum: 99},
   {type: "object", properties: {op: {enum: ["+", "*"]}, args: {type: "array", items: {$ref: "#/$defs/expr"}, minItems: 2, maxItems: 2}},
    required: ["op", "args"]}]}}, $ref: "#/$defs/expr"},
];

// ------------------------------------------------------------- generated --

let seed = 20240601;
function rnd() { // mulberry32
  seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));

const WORDS = ["id", "name", "value", "count", "items", "kind", "title", "score", "tags", "meta", "x", "y", "enabled", "data",
               "label", "note", "level", "start", "end", "owner", "ratio", "unit", "status", "path"];
const PATTERNS = ["^[a-z]+$", "^[A-Z]{2}[0-9]{2,4}$", "^(yes|no|maybe)$", "^[a-z0-9_]{1,12}$", "^\\d{3}-\\d{4}$",
                  "^[^@\\s]{1,10}@[a-z]{1,8}\\.(com|org)$", "^v[0-9]+\\.[0-9]+(\\.[0-9]+)?$", "^#[0-9a-fA-F]{6}$"];
const FORMATS = ["date", "time", "date-time", "uuid", "email", "ipv4"];

function genString() {
  const r = rnd();
  if (r < 0.35) return {type: "string"};
  if (r < 0.55) { const a = int(0, 4); return {type: "string", minLength: a, maxLength: a + int(0, 12)}; }
  if (r < 0.7) return {type: "string", pattern: pick(PATTERNS)};
  if (r < 0.85) return {type: "string", format: pick(FORMATS)};
  return {type: "string", enum: Array.from({length: int(1, 4)}, (_, i) => pick(WORDS) + i)};
}

function genNumber(integer) {
  const s = {type: integer ? "integer" : "number"};
  if (rnd() < 0.6) s[rnd() < 0.3 ? "exclusiveMinimum" : "minimum"] = integer ? int(-50, 50) : int(-500, 500) / 10;
  if (rnd() < 0.6) {
    const lo = s.minimum ?? s.exclusiveMinimum ?? -100;
    s[rnd() < 0.3 ? "exclusiveMaximum" : "maximum"] = lo + (integer ? int(2, 2000) : int(20, 20000) / 10);
  }
  return s;
}

function genSchema(depth, defs) {
  const r = rnd();
  if (depth >= 3 || r < 0.35) {
    const t = rnd();
    if (t < 0.4) return genString();
    if (t < 0.6) return genNumber(true);
    if (t < 0.75) return genNumber(false);
    if (t < 0.85) return {type: "boolean"};
    if (t < 0.9) return {const: pick([1, "x", true, null])};
    return {type: pick([["string", "null"], ["integer", "string"], ["boolean", "null"]])};
  }
  if (r < 0.6) { // object
    const n = int(1, 5), props = {}, names = [];
    for (let i = 0; i < n; i++) { const k = pick(WORDS) + (rnd() < 0.3 ? "_" + i : ""); if (!(k in props)) { props[k] = genSchema(depth + 1, defs); names.push(k); } }
    const s = {type: "object", properties: props, required: names.filter(() => rnd() < 0.6)};
    const a = rnd();
    if (a < 0.3) s.additionalProperties = false;
    else if (a < 0.4) s.additionalProperties = genSchema(3, defs);
    else if (a < 0.45) s.additionalProperties = true;
    return s;
  }
  if (r < 0.75) { // array
    const s = {type: "array", items: genSchema(depth + 1, defs)};
    if (rnd() < 0.5) s.minItems = int(0, 2);
    if (rnd() < 0.6) s.maxItems = (s.minItems ?? 0) + int(0, 4);
    if (rnd() < 0.15) { s.prefixItems = [genSchema(3, defs), genSchema(3, defs)]; if (rnd() < 0.5) s.items = false; }
    return s;
  }
  if (r < 0.85) return {anyOf: [genSchema(depth + 1, defs), pick([{type: "null"}, genSchema(3, defs)])]};
  if (r < 0.9) { // oneOf, discriminated
    return {oneOf: ["a", "b", "c"].slice(0, int(2, 3)).map((tag) => ({type: "object",
      properties: {kind: {const: tag}, body: genSchema(depth + 1, defs)}, required: ["kind", "body"]}))};
  }
  if (r < 0.95) { // $ref to a shared definition
    const name = "d" + Object.keys(defs).length;
    defs[name] = {}; // reserved before nested definitions take numbers
    defs[name] = genSchema(depth + 1, defs);
    return {$ref: "#/$defs/" + name};
  }
  // recursive: a tree whose children are optional
  const name = "rec" + Object.keys(defs).length;
  defs[name] = {};
  defs[name] = {type: "object", properties: {v: genSchema(3, defs), kids: {type: "array", items: {$ref: "#/$defs/" + name}, maxItems: 2}},
                required: ["v"]};
  return {$ref: "#/$defs/" + name};
}

const ajv = new Ajv({strict: false, validateFormats: false});
const out = [];
for (const s of HAND) out.push(s);
while (out.length < 300) {
  const defs = {};
  const s = genSchema(0, defs);
  const doc = Object.keys(defs).length ? {...s, $defs: defs} : s;
  ajv.compile(doc);
  out.push(doc);
}
for (const s of out) { ajv.compile(s); process.stdout.write(JSON.stringify(s) + "\n"); }
