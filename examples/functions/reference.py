#!/usr/bin/env python3
"""The reference of the example functions (docs/functions.md): what each one's output
collection must hold after a log, computed from the log's final records.

It is the oracle the tests compare the components with, so it is written to be obviously
correct rather than fast, and it computes the outputs **from the final records**, not from
changes: a component's deltas, folded over every change, must end at the same collection
(that is what makes live processing plus a backfill exact). The incremental form of each
example is here too (`*_deltas`, the same logic as the components), with `apply_deltas`,
so the tests can check that the two forms agree.

The log is the JSON-lines input of `sluice produce` (docs/producing.md), one object a
line: {"collection", "id", "operation": add|update|upsert|delete, "embedding": [numbers]
or null, "metadata": {key: string|integer|float|bool|null} or null, "document": string or
null}. Offsets are the positions of the non-empty lines, from 0. The fold follows the
record model of src/materialize/model.rs:

- ADD inserts a record only if the id is absent (else it is ignored); UPDATE merges only
  if it is present (else ignored); UPSERT inserts or merges; DELETE removes a present
  record (else ignored).
- An insert takes the line's fields, without its null metadata values. A merge sets each
  metadata key of the line (null removes the key) and replaces the document and the
  embedding only when the line has them.
- The first embedding of an applied insert or merge fixes the collection's dimension; any
  later line carrying an embedding of another length is rejected, whatever its operation.
- Embedding numbers are stored as float32; a metadata integer is a long when it fits in
  64 bits, otherwise a double (as `sluice produce` reads them).

Lines that `sluice produce` would refuse (an empty id, a non-finite number, ...) are not
modelled: the log is assumed valid.

Usage:
    reference.py outputs FUNCTION --params JSON LOG.jsonl [--collection C]
        the expected output collection as one JSON object {id: metadata}, keys sorted
    reference.py changes LOG.jsonl [--collection C]
        the changes the fold makes, one JSON object a line (id, offset, before, after;
        metadata values as [tag, value] with tag str|long|double|boolean)
FUNCTION is word_count, norm_guard, project_keys or count_records. With one collection in the log
--collection may be left out.
"""
import argparse
import hashlib
import json
import math
import struct
import sys

FUNCTIONS = ("word_count", "norm_guard", "project_keys", "count_records")

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


# ---------------------------------------------------------------------------------------
# Values and records


def f32(x):
    """`x` rounded to float32, as the log stores embedding numbers."""
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def meta_value(value):
    """A JSON metadata value as stored: bool, int (a long), float (a double), str, or None
    (null: removes the key in a merge, dropped in an insert)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if I64_MIN <= value <= I64_MAX else float(value)
    if isinstance(value, float):
        return value
    raise ValueError("metadata values are strings, numbers, booleans or null, not %r" % (value,))


def tag(value):
    """The WIT meta-value case of a stored value."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    return "str"


class Record:
    """A stored record: id, embedding (list of float32 values as floats, or None),
    metadata (dict, no None values), document (str or None), offset (its version)."""

    __slots__ = ("id", "embedding", "metadata", "document", "offset")

    def __init__(self, id, embedding, metadata, document, offset):
        self.id = id
        self.embedding = embedding
        self.metadata = metadata
        self.document = document
        self.offset = offset

    def copy(self):
        embedding = None if self.embedding is None else list(self.embedding)
        return Record(self.id, embedding, dict(self.metadata), self.document, self.offset)

    def to_json(self):
        return {
            "id": self.id,
            "embedding": self.embedding,
            "metadata": [[k, tag(v), v] for k, v in sorted(self.metadata.items())],
            "document": self.document,
            "offset": self.offset,
        }


class Change:
    """One change: the record before and after the log record at `offset` (None = absent)."""

    __slots__ = ("id", "before", "after", "offset")

    def __init__(self, id, before, after, offset):
        self.id = id
        self.before = before
        self.after = after
        self.offset = offset

    def to_json(self):
        return {
            "id": self.id,
            "offset": self.offset,
            "before": None if self.before is None else self.before.to_json(),
            "after": None if self.after is None else self.after.to_json(),
        }


# ---------------------------------------------------------------------------------------
# The log and its fold


def read_log(lines):
    """[(offset, line object)] of the non-empty lines, offsets from 0."""
    log = []
    for line in lines:
        if not line.strip():
            continue
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("line %d: expected a JSON object" % (len(log) + 1))
        operation = str(obj.get("operation", "")).lower()
        if operation not in ("add", "update", "upsert", "delete"):
            raise ValueError("line %d: operation %r is not add, update, upsert or delete" % (len(log) + 1, operation))
        log.append((len(log), obj))
    return log


def pick_collection(log, collection):
    names = sorted({obj["collection"] for _, obj in log})
    if collection is not None:
        return collection
    if len(names) == 1:
        return names[0]
    if not names:
        return None
    raise ValueError("the log has several collections (%s): name one with --collection" % ", ".join(names))


def fold(log, collection):
    """(final records by id, changes in offset order) of `collection` after `log`."""
    records = {}
    changes = []
    dimension = None
    for offset, obj in log:
        if obj["collection"] != collection:
            continue
        id = obj["id"]
        operation = obj["operation"].lower()
        raw_embedding = obj.get("embedding")
        embedding = None if raw_embedding is None else [f32(x) for x in raw_embedding]
        raw_metadata = obj.get("metadata")
        metadata = None if raw_metadata is None else {k: meta_value(v) for k, v in raw_metadata.items()}
        document = obj.get("document")
        if dimension is not None and embedding is not None and len(embedding) != dimension:
            continue  # rejected: dimension mismatch
        before = records.get(id)
        if operation == "add" and before is not None:
            continue  # ignored: add_existing
        if operation == "update" and before is None:
            continue  # ignored: update_missing
        if operation == "delete":
            if before is None:
                continue  # ignored: delete_missing
            del records[id]
            changes.append(Change(id, before, None, offset))
            continue
        if before is None:
            kept = {k: v for k, v in (metadata or {}).items() if v is not None}
            after = Record(id, embedding, kept, document, offset)
        else:
            after = before.copy()
            for k, v in (metadata or {}).items():
                if v is None:
                    after.metadata.pop(k, None)
                else:
                    after.metadata[k] = v
            if document is not None:
                after.document = document
            if embedding is not None:
                after.embedding = embedding
            after.offset = offset
        if dimension is None and embedding is not None:
            dimension = len(embedding)
        records[id] = after
        changes.append(Change(id, before, after, offset))
    return records, changes


# ---------------------------------------------------------------------------------------
# The examples' parameters


def parse_params(function, text):
    params = json.loads(text)
    if not isinstance(params, dict):
        raise ValueError("params must be a JSON object")
    if function == "word_count":
        if set(params) != {"key"} or not isinstance(params["key"], str) or not params["key"]:
            raise ValueError('word_count takes {"key": "<metadata key>"}')
    elif function == "norm_guard":
        if set(params) != {"min", "max"}:
            raise ValueError('norm_guard takes {"min": <number>, "max": <number>}')
        for k in ("min", "max"):
            v = params[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError("norm_guard: %r must be a finite number" % k)
        if not params["min"] <= params["max"]:
            raise ValueError("norm_guard: min must not be greater than max")
        params = {"min": float(params["min"]), "max": float(params["max"])}
    elif function == "project_keys":
        keep = params.get("keep")
        if set(params) != {"keep"} or not isinstance(keep, list) or not all(isinstance(k, str) and k for k in keep):
            raise ValueError('project_keys takes {"keep": ["<metadata key>", ...]}')
    elif function == "count_records":
        if params:
            raise ValueError("count_records takes no parameters")
    else:
        raise ValueError("unknown function %r: one of %s" % (function, ", ".join(FUNCTIONS)))
    return params


# ---------------------------------------------------------------------------------------
# word_count


WORD_COUNT_MAX_ID_BYTES = 256


def value_id(value):
    """word_count's output id of a metadata value: `<tag>:<value>`, hashed past 256 bytes."""
    if isinstance(value, bool):
        full = "b:true" if value else "b:false"
    elif isinstance(value, int):
        full = "l:%d" % value
    elif isinstance(value, float):
        full = "d:" + repr(value)
    else:
        full = "s:" + value
    encoded = full.encode("utf-8")
    if len(encoded) > WORD_COUNT_MAX_ID_BYTES:
        return "h:" + hashlib.sha256(encoded).hexdigest()
    return full


def words(document):
    return len(document.split()) if document else 0


def word_count_outputs(records, params):
    key = params["key"]
    outputs = {}
    for record in records.values():
        if key not in record.metadata:
            continue
        value = record.metadata[key]
        output = outputs.setdefault(value_id(value), {"key": key, "value": value, "words": 0})
        output["words"] += words(record.document)
    return {id: m for id, m in outputs.items() if m["words"] != 0}


def word_count_deltas(change, params):
    key = params["key"]
    sums = {}
    for record, sign in ((change.before, -1), (change.after, 1)):
        if record is None or key not in record.metadata:
            continue
        n = words(record.document)
        if n:
            value = record.metadata[key]
            entry = sums.setdefault(value_id(value), [value, 0])
            entry[1] += sign * n
    return [
        ("count", id, {"key": key, "value": value}, "words", delta, True)
        for id, (value, delta) in sorted(sums.items())
        if delta != 0
    ]


# ---------------------------------------------------------------------------------------
# norm_guard


def l2_norm(embedding):
    """In double precision, the squares summed in index order (as the JS example does)."""
    total = 0.0
    for x in embedding:
        total += x * x
    return math.sqrt(total)


def norm_side(record, params):
    if record is None or record.embedding is None:
        return None
    n = l2_norm(record.embedding)
    if n < params["min"]:
        return "below"
    if n > params["max"]:
        return "above"
    return None


def norm_guard_outputs(records, params):
    counts = {}
    for record in records.values():
        side = norm_side(record, params)
        if side is not None:
            counts[side] = counts.get(side, 0) + 1
    return {side: {"min": params["min"], "max": params["max"], "count": n} for side, n in counts.items()}


def norm_guard_deltas(change, params):
    was = norm_side(change.before, params)
    now = norm_side(change.after, params)
    fields = {"min": params["min"], "max": params["max"]}
    out = []
    for side in ("above", "below"):
        delta = (now == side) - (was == side)
        if delta:
            out.append(("count", side, fields, "count", delta, True))
    return out


# ---------------------------------------------------------------------------------------
# project_keys


def projected(metadata, keep):
    return {k: metadata[k] for k in keep if k in metadata}


def project_keys_outputs(records, params):
    return {id: projected(r.metadata, params["keep"]) for id, r in records.items()}


def project_keys_deltas(change, params):
    if change.after is None:
        return [("remove", change.id, change.offset)]
    return [("put", change.id, projected(change.after.metadata, params["keep"]), change.offset)]


# ---------------------------------------------------------------------------------------
# count_records (the built-in record_counter's logic)


def count_records_deltas(change, params):
    if (change.before is None) == (change.after is None):
        return []  # a merge keeps the record live
    return [("count", "function_output", {}, "total_count", 1 if change.before is None else -1, False)]


def count_records_outputs(records, params, changes):
    """The counter exists once a delta made it (an insert); it is kept at zero."""
    if not any(c.before is None for c in changes):
        return {}
    return {"function_output": {"total_count": len(records)}}


OUTPUTS = {
    "word_count": lambda records, params, changes: word_count_outputs(records, params),
    "norm_guard": lambda records, params, changes: norm_guard_outputs(records, params),
    "project_keys": lambda records, params, changes: project_keys_outputs(records, params),
    "count_records": count_records_outputs,
}
DELTAS = {
    "word_count": word_count_deltas,
    "norm_guard": norm_guard_deltas,
    "project_keys": project_keys_deltas,
    "count_records": count_records_deltas,
}


# ---------------------------------------------------------------------------------------
# Deltas applied to an output collection (src/functions/apply.rs, unversioned: in order)


def apply_deltas(outputs, deltas):
    """Apply deltas in order to `outputs` ({id: metadata}), as the sysdb does for a function
    that is ready: a count adds to its counter (removed at 0 when remove-at-zero), a put
    overwrites, a remove deletes."""
    for delta in deltas:
        if delta[0] == "count":
            _, id, fields, count_field, n, remove_at_zero = delta
            current = outputs.get(id, {}).get(count_field, 0)
            count = current + n
            if count == 0 and remove_at_zero:
                outputs.pop(id, None)
            else:
                metadata = dict(fields)
                metadata[count_field] = count
                outputs[id] = metadata
        elif delta[0] == "put":
            _, id, metadata, _offset = delta
            outputs[id] = dict(metadata)
        elif delta[0] == "remove":
            outputs.pop(delta[1], None)
        else:
            raise ValueError("unknown delta %r" % (delta,))
    return outputs


# ---------------------------------------------------------------------------------------
# Entry points


def expected_outputs(function, params_text, lines, collection=None):
    """The expected output collection {id: metadata} of `function` after the log `lines`."""
    params = parse_params(function, params_text)
    log = read_log(lines)
    records, changes = fold(log, pick_collection(log, collection))
    return OUTPUTS[function](records, params, changes)


def changes_of(lines, collection=None):
    log = read_log(lines)
    return fold(log, pick_collection(log, collection))[1]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    out = sub.add_parser("outputs", help="the expected output collection of an example")
    out.add_argument("function", choices=FUNCTIONS)
    out.add_argument("--params", required=True, help="the JSON params given at attach")
    out.add_argument("log", help="a JSON-lines log (- for stdin)")
    out.add_argument("--collection")
    ch = sub.add_parser("changes", help="the changes of the log's fold, one JSON object a line")
    ch.add_argument("log", help="a JSON-lines log (- for stdin)")
    ch.add_argument("--collection")
    args = parser.parse_args(argv)
    source = sys.stdin if args.log == "-" else open(args.log, encoding="utf-8")
    with source:
        lines = source.read().splitlines()
    try:
        if args.command == "outputs":
            result = expected_outputs(args.function, args.params, lines, args.collection)
            print(json.dumps(result, sort_keys=True, ensure_ascii=False))
        else:
            for change in changes_of(lines, args.collection):
                print(json.dumps(change.to_json(), ensure_ascii=False))
    except ValueError as e:
        print("reference.py: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
