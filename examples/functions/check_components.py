#!/usr/bin/env python3
"""Checks the built example components against examples/functions/reference.py: each one,
transpiled to JavaScript by jco and run in Node over the changes of sample.jsonl and of
random logs, must give exactly the reference's deltas for every change (the same counters,
puts and removes, in the same order, values typed), declare the reference's `reads`, and
refuse bad params at init. Run by scripts/build-functions.sh after a build.

    examples/functions/check_components.py [DIR]     # DIR: the built .wasm files (target/functions)

Needs node and jco (`npm ci` in examples/functions/js). Prints one line per component and
a closing `N passed, N failed`; exits 1 on any failure.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import reference  # noqa: E402
from test_reference import random_log  # noqa: E402

JCO = os.path.join(HERE, "js", "node_modules", ".bin", "jco")
RUNNER = os.path.join(HERE, "run_component.mjs")
SAMPLE = os.path.join(HERE, "sample.jsonl")

# (file, function, params, reads, bad params)
COMPONENTS = (
    ("word_count.wasm", "word_count", '{"key": "genre"}',
     {"embedding": False, "metadata": True, "document": True}, '{"key": 3}'),
    ("norm_guard.wasm", "norm_guard", '{"min": 0.5, "max": 2}',
     {"embedding": True, "metadata": False, "document": False}, '{"min": 2, "max": 1}'),
    ("project_keys.wasm", "project_keys", '{"keep": ["genre", "year"]}',
     {"embedding": False, "metadata": True, "document": False}, '{"keep": "genre"}'),
    ("count_records.wasm", "count_records", '{}',
     {"embedding": False, "metadata": False, "document": False}, '{"x": 1}'),
)
RANDOM_LOGS = 8


def typed(metadata):
    return {k: [reference.tag(v), str(v) if reference.tag(v) == "long" else v] for k, v in metadata.items()}


def canonical(delta):
    """A reference delta in run_component.mjs's form."""
    if delta[0] == "count":
        _, id, fields, count_field, n, remove_at_zero = delta
        return ["count", id, typed(fields), count_field, str(n), remove_at_zero]
    if delta[0] == "put":
        _, id, metadata, offset = delta
        return ["put", id, typed(metadata), None, None, str(offset)]
    _, id, offset = delta
    return ["remove", id, str(offset)]


def node_command():
    """node, with extended constant expressions turned on where they are not by default
    (Node 20: the Python component uses them; wasmtime has them on)."""
    flag = "--experimental-wasm-extended-const"
    accepted = subprocess.run(["node", flag, "-e", "0"], capture_output=True).returncode == 0
    return ["node", flag] if accepted else ["node"]


NODE = None


def run(module, params, changes):
    global NODE
    if NODE is None:
        NODE = node_command()
    stdin = "".join(json.dumps(c.to_json()) + "\n" for c in changes)
    done = subprocess.run(NODE + [RUNNER, module, params], input=stdin, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError("run_component.mjs failed (exit %d): %s" % (done.returncode, done.stderr.strip()[-2000:]))
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def check(module, function, params, reads, bad_params):
    """Problems of one transpiled component, as text lines (empty: it passed)."""
    problems = []
    first = run(module, bad_params, [])
    if not (len(first) == 1 and "init_error" in first[0]):
        problems.append("init(%s) did not fail: %r" % (bad_params, first))
    rng = random.Random(4646)
    logs = [("sample.jsonl", open(SAMPLE, encoding="utf-8").read().splitlines())]
    logs += [("random log %d" % i, random_log(rng, 60)) for i in range(RANDOM_LOGS)]
    parsed = reference.parse_params(function, params)
    for name, lines in logs:
        changes = reference.changes_of(lines)
        out = run(module, params, changes)
        if out[0] != {"reads": reads}:
            problems.append("reads() is %r, expected %r" % (out[0], reads))
        for change, got in zip(changes, out[1:]):
            expected = [canonical(d) for d in reference.DELTAS[function](change, parsed)]
            if got != expected:
                problems.append("%s, change at offset %d (%s): deltas %s, expected %s" % (
                    name, change.offset, change.id, json.dumps(got), json.dumps(expected)))
                break
        if len(out) != len(changes) + 1:
            problems.append("%s: %d answers for %d changes" % (name, len(out) - 1, len(changes)))
    return problems


def main(argv):
    directory = argv[0] if argv else os.path.join(HERE, "..", "..", "target", "functions")
    if not os.access(JCO, os.X_OK):
        print("check_components.py: %s missing. Fix: (cd examples/functions/js && npm ci)" % JCO, file=sys.stderr)
        return 2
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="sluice-functions-") as tmp:
        for file, function, params, reads, bad_params in COMPONENTS:
            wasm = os.path.join(directory, file)
            out_dir = os.path.join(tmp, function)
            transpiled = subprocess.run(
                [JCO, "transpile", wasm, "-o", out_dir, "--name", function, "--no-typescript"],
                capture_output=True, text=True)
            if transpiled.returncode != 0:
                problems = ["jco transpile failed: %s" % (transpiled.stderr.strip() or transpiled.stdout.strip())]
            else:
                try:
                    problems = check(os.path.join(out_dir, function + ".js"), function, params, reads, bad_params)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    problems = [str(e)]
            if problems:
                failed += 1
                print("FAIL %s (%s)" % (file, function))
                for p in problems:
                    print("  " + p)
            else:
                passed += 1
                print("ok   %s (%s): equal to the reference on sample.jsonl and %d random logs" % (file, function, RANDOM_LOGS))
    print("components: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
