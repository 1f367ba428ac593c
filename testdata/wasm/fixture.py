"""The test fixture component of Sluice's WebAssembly host (src/functions/wasm/tests.rs,
integration-tests/tests/it/wasm_functions.rs): one source, whose behaviour `init` picks
from its JSON parameters, so that one compiled component serves every test.

{"mode": "count_by", "key": K}   counts records per string value of metadata K
                                  (output id "K=value", field K, count "count",
                                  removed at zero); reads the metadata.
{"mode": "project", "keep": [..]} a copy of each record with only the kept metadata
                                  keys and its document; a removal when it goes.
{"mode": "loop" | "alloc" | "trap" | "err", "on": ID}
                                  on the change of record ID (every change when "on"
                                  is missing): loop forever, allocate without end,
                                  raise an exception (a trap), or return an error;
                                  any other change emits nothing.
Anything else: init returns an error.

Built by scripts/build-wasm-fixtures.sh (with --stub-wasi: it imports nothing; without
it: the WASI-importing variant; against a 2.0.0 copy of the world: the other major version).
"""
import json

from wit_world import exports
from wit_world.imports import types
from componentize_py_types import Err

MODES = ("count_by", "project", "loop", "alloc", "trap", "err")


class Guest(exports.Guest):
    def init(self, params: str) -> None:
        global CONFIG
        try:
            p = json.loads(params)
        except ValueError as e:
            raise Err(f"params are not JSON: {e}")
        mode = p.get("mode") if isinstance(p, dict) else None
        if mode not in MODES:
            raise Err(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        if mode == "count_by" and not isinstance(p.get("key"), str):
            raise Err("count_by needs a string key")
        CONFIG = p

    def reads(self) -> types.StoredFields:
        mode = CONFIG["mode"]
        if mode == "count_by":
            return types.StoredFields.METADATA
        if mode == "project":
            return types.StoredFields.METADATA | types.StoredFields.DOCUMENT
        return types.StoredFields(0)

    def deltas(self, change: types.Change) -> list:
        mode = CONFIG["mode"]
        if mode == "count_by":
            return count_by(CONFIG["key"], change)
        if mode == "project":
            return project(CONFIG.get("keep", []), change)
        on = CONFIG.get("on")
        if on is not None and on != change.id:
            return []
        if mode == "loop":
            n = 0
            while True:
                n += 1
        if mode == "alloc":
            hoard = []
            while True:
                hoard.append(bytearray(1 << 20))
        if mode == "trap":
            raise RuntimeError(f"the fixture traps on {change.id}")
        raise Err(f"the fixture refuses record {change.id}")


CONFIG = {"mode": "count_by", "key": ""}


def value_of(record, key):
    if record is None:
        return None
    for e in record.metadata:
        if e.key == key and isinstance(e.value, types.MetaValue_Str):
            return e.value.value
    return None


def count_by(key, change):
    out = []
    for record, delta in ((change.before, -1), (change.after, 1)):
        v = value_of(record, key)
        if v is not None:
            out.append(types.OutputDelta_Count(types.Counter(
                output_id=f"{key}={v}",
                fields=[types.MetaEntry(key, types.MetaValue_Str(v))],
                count_field="count",
                delta=delta,
                remove_at_zero=True,
            )))
    return out


def project(keep, change):
    if change.after is None:
        return [types.OutputDelta_Remove(types.Removal(change.id, change.offset))]
    a = change.after
    meta = [e for e in a.metadata if e.key in keep]
    return [types.OutputDelta_Put(types.StoredRecord(a.id, None, meta, a.document, change.offset))]
