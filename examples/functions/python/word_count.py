"""word_count: the words of the documents, summed per value of one metadata key.

An attached Sluice function (docs/functions.md) built with componentize-py. Params:
{"key": "genre"}. For every live record that holds the key, its document's words
(whitespace-separated, as Python's str.split() counts them; no document = 0 words) are
added to the output record of the key's value. Each output record has the metadata
`key` (the key), `value` (the value, typed) and `words` (the sum); a value whose sum
falls to 0 is removed.

A change subtracts the words of `before` from its value's counter and adds those of
`after` to its value's counter, netted when the value is the same, so updates and
deletes are exact and increments commute with a backfill.

Output ids: `<tag>:<value>` with tag `s` (string, as is), `l` (integer), `d` (double,
Python's shortest round-trip repr, e.g. 0.5, -0.0, 1e+300) or `b` (true/false); an
encoding longer than 256 bytes is replaced by `h:` + the SHA-256 of it in hex.
examples/functions/reference.py computes the same outputs from a log.
"""

import hashlib
import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types

MAX_ID_BYTES = 256


def value_id(value) -> str:
    """The output id of a metadata value (module doc)."""
    if isinstance(value, types.MetaValue_Str):
        full = "s:" + value.value
    elif isinstance(value, types.MetaValue_Long):
        full = "l:%d" % value.value
    elif isinstance(value, types.MetaValue_Double):
        full = "d:" + repr(value.value)
    else:
        full = "b:true" if value.value else "b:false"
    encoded = full.encode("utf-8")
    if len(encoded) > MAX_ID_BYTES:
        return "h:" + hashlib.sha256(encoded).hexdigest()
    return full


def words(document) -> int:
    return len(document.split()) if document else 0


class Guest(exports.Guest):
    key = None

    def init(self, params: str) -> None:
        try:
            parsed = json.loads(params)
        except ValueError as e:
            raise Err("params are not JSON: %s" % e)
        if not isinstance(parsed, dict):
            raise Err('params must be an object like {"key": "genre"}')
        unknown = sorted(set(parsed) - {"key"})
        if unknown:
            raise Err("unknown parameter %r: word_count takes only \"key\"" % unknown[0])
        key = parsed.get("key")
        if not isinstance(key, str) or not key:
            raise Err('parameter "key" must be a non-empty string (the metadata key to group by)')
        Guest.key = key

    def reads(self) -> types.StoredFields:
        return types.StoredFields.METADATA | types.StoredFields.DOCUMENT

    def deltas(self, change: types.Change):
        if Guest.key is None:
            raise Err("word_count: deltas called before init")
        # output id -> [value, delta]; netted so an unchanged value emits one delta or none.
        sums = {}
        for record, sign in ((change.before, -1), (change.after, 1)):
            if record is None:
                continue
            value = self._value(record)
            if value is None:
                continue
            n = words(record.document)
            if n == 0:
                continue
            entry = sums.setdefault(value_id(value), [value, 0])
            entry[1] += sign * n
        out = []
        for output_id in sorted(sums):
            value, delta = sums[output_id]
            if delta == 0:
                continue
            fields = [
                types.MetaEntry("key", types.MetaValue_Str(Guest.key)),
                types.MetaEntry("value", value),
            ]
            counter = types.Counter(output_id, fields, "words", delta, True)
            out.append(types.OutputDelta_Count(counter))
        return out

    def _value(self, record):
        for entry in record.metadata:
            if entry.key == Guest.key:
                return entry.value
        return None
