// Runs a function component, transpiled to JavaScript by `jco transpile`, over changes,
// for examples/functions/check_components.py: the component's own code in Node's
// WebAssembly engine, with no host of Sluice's. Not a host: no limits, no sysdb.
//
//   node run_component.mjs TRANSPILED.js PARAMS_JSON < changes.jsonl
//
// stdin: the changes of `reference.py changes`, one a line. stdout: first a line
// {"reads": {...}}, then one line per change: the deltas in the canonical form of
// check_components.py (metadata values as [tag, value], longs as decimal strings), or
// {"error": text} when `deltas` returned an error. An error of `init` is printed as
// {"init_error": text} and ends the run.
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { resolve } from "node:path";

const [modulePath, params] = process.argv.slice(2);
if (!modulePath || params === undefined) {
  console.error("usage: node run_component.mjs TRANSPILED.js PARAMS_JSON < changes.jsonl");
  process.exit(2);
}
const { guest } = await import(pathToFileURL(resolve(modulePath)).href);

const errorText = (e) => (e && Object.prototype.hasOwnProperty.call(e, "payload") ? e.payload : String(e));

function toValue([tag, val]) {
  return { tag, val: tag === "long" ? BigInt(val) : val };
}

function toRecord(r) {
  if (r === null) return undefined;
  return {
    id: r.id,
    embedding: r.embedding === null ? undefined : new Float32Array(r.embedding),
    metadata: r.metadata.map(([key, tag, val]) => ({ key, value: toValue([tag, val]) })),
    document: r.document === null ? undefined : r.document,
    offset: BigInt(r.offset),
  };
}

function fromValue({ tag, val }) {
  return [tag, tag === "long" ? val.toString() : val];
}

function fromEntries(entries) {
  const out = {};
  for (const { key, value } of entries) out[key] = fromValue(value);
  return out;
}

function canonical(delta) {
  const v = delta.val;
  switch (delta.tag) {
    case "count":
      return ["count", v.outputId, fromEntries(v.fields), v.countField, v.delta.toString(), v.removeAtZero];
    case "put":
      return [
        "put",
        v.id,
        fromEntries(v.metadata),
        v.embedding === undefined || v.embedding === null ? null : Array.from(v.embedding),
        v.document === undefined || v.document === null ? null : v.document,
        v.offset.toString(),
      ];
    case "remove":
      return ["remove", v.id, v.offset.toString()];
    default:
      throw new Error(`unknown delta ${delta.tag}`);
  }
}

try {
  guest.init(params);
} catch (e) {
  console.log(JSON.stringify({ init_error: errorText(e) }));
  process.exit(0);
}
console.log(JSON.stringify({ reads: guest.reads() }));

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const c = JSON.parse(line);
  const change = { id: c.id, before: toRecord(c.before), after: toRecord(c.after), offset: BigInt(c.offset) };
  let result;
  try {
    result = guest.deltas(change).map(canonical);
  } catch (e) {
    result = { error: errorText(e) };
  }
  console.log(JSON.stringify(result));
}
