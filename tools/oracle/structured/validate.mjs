// validate.mjs - the oracle of tests/structured/test_sg_schema.c: each line
// of OUTPUTS is {"schema": i, "text": "..."}; text must parse as JSON and
// validate with ajv against line i of SCHEMAS. Formats are checked by the
// functions below (written from RFC 3339 / 4122 / 5321 here, not from the
// grammar's patterns).
//   node validate.mjs SCHEMAS OUTPUTS      prints "validated N", exits 1 on any failure
import {readFileSync} from "node:fs";
import Ajv from "ajv/dist/2020.js";

function isDate(s) {
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
  if (!m) return false;
  const [y, mo, d] = [+m[1], +m[2], +m[3]];
  const t = new Date(Date.UTC(y, mo - 1, d));
  return t.getUTCFullYear() === y && t.getUTCMonth() === mo - 1 && t.getUTCDate() === d;
}
function isTime(s) {
  const m = /^(\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|([+-])(\d{2}):(\d{2}))$/.exec(s);
  if (!m) return false;
  if (+m[1] > 23 || +m[2] > 59 || +m[3] > 60) return false;
  return !m[6] || (+m[7] <= 23 && +m[8] <= 59);
}
function isDateTime(s) {
  const i = s.search(/[Tt ]/);
  return i === 10 && isDate(s.slice(0, 10)) && isTime(s.slice(11));
}
const isUuid = (s) => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(s);
function isEmail(s) {
  const at = s.lastIndexOf("@");
  if (at <= 0 || at > 64) return false;
  const local = s.slice(0, at), domain = s.slice(at + 1);
  if (!/^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*$/.test(local)) return false;
  const labels = domain.split(".");
  return labels.length >= 2 && labels.every((l) => /^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/.test(l));
}
const isIpv4 = (s) => { const p = s.split("."); return p.length === 4 && p.every((o) => /^(0|[1-9]\d{0,2})$/.test(o) && +o <= 255); };

const ajv = new Ajv({strict: false, allErrors: false});
for (const [name, f] of Object.entries({date: isDate, time: isTime, "date-time": isDateTime, uuid: isUuid, email: isEmail, ipv4: isIpv4}))
  ajv.addFormat(name, {type: "string", validate: f});

const [schemaPath, outPath] = process.argv.slice(2);
const schemas = readFileSync(schemaPath, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
const validators = schemas.map((s) => ajv.compile(s));
let n = 0, bad = 0;
for (const line of readFileSync(outPath, "utf8").split("\n")) {
  if (!line) continue;
  const {schema, text} = JSON.parse(line);
  let value, ok = true, why = "";
  try { value = JSON.parse(text); } catch (e) { ok = false; why = "not JSON: " + e.message; }
  if (ok && !validators[schema](value)) { ok = false; why = ajv.errorsText(validators[schema].errors); }
  n++;
  if (!ok) { bad++; if (bad <= 20) console.log(`schema ${schema}: ${why}\n  text: ${text}`); }
}
console.log(`validated ${n}, failed ${bad}`);
process.exit(bad || !n ? 1 : 0);
