// norm_guard: how many live records have an embedding whose L2 norm is outside
// [min, max]. An attached Sluice function (docs/functions.md) built with
// componentize-js. Params: {"min": 0.5, "max": 2.0} (finite numbers, min <= max).
//
// Two output records, "below" (norm < min) and "above" (norm > max), each with the
// metadata `min`, `max` (the bounds, doubles) and `count`; one whose count falls to 0 is
// removed, so an absent one means 0. A record without an embedding is in neither.
//
// The norm is computed in double precision, the squares summed in index order, then
// Math.sqrt (correctly rounded), so it is the same bits on every engine:
// examples/functions/reference.py computes the same outputs from a log.
//
// A change counts -1 for the side `before` is on and +1 for the side `after` is on,
// netted, so updates and deletes are exact and increments commute with a backfill.

let bounds = null;

// The error of a result<_, string>: componentize-js returns a thrown value's `payload`.
function fail(message) {
  return { payload: message };
}

function parseParams(text) {
  let params;
  try {
    params = JSON.parse(text);
  } catch (e) {
    throw fail(`params are not JSON: ${e}`);
  }
  if (params === null || typeof params !== "object" || Array.isArray(params)) {
    throw fail('params must be an object like {"min": 0.5, "max": 2.0}');
  }
  for (const key of Object.keys(params)) {
    if (key !== "min" && key !== "max") {
      throw fail(`unknown parameter "${key}": norm_guard takes "min" and "max"`);
    }
  }
  const { min, max } = params;
  if (typeof min !== "number" || !Number.isFinite(min)) {
    throw fail('parameter "min" must be a finite number');
  }
  if (typeof max !== "number" || !Number.isFinite(max)) {
    throw fail('parameter "max" must be a finite number');
  }
  if (!(min <= max)) {
    throw fail(`"min" (${min}) must not be greater than "max" (${max})`);
  }
  return { min, max };
}

// The L2 norm in double precision, summed in index order.
function norm(embedding) {
  let sum = 0;
  for (let i = 0; i < embedding.length; i++) {
    const x = embedding[i];
    sum += x * x;
  }
  return Math.sqrt(sum);
}

// "below", "above" or null (inside the bounds, or no embedding).
function side(record) {
  if (record === undefined || record === null) return null;
  const e = record.embedding;
  if (e === undefined || e === null) return null;
  const n = norm(e);
  if (n < bounds.min) return "below";
  if (n > bounds.max) return "above";
  return null;
}

function counter(outputId, delta) {
  return {
    tag: "count",
    val: {
      outputId,
      fields: [
        { key: "max", value: { tag: "double", val: bounds.max } },
        { key: "min", value: { tag: "double", val: bounds.min } },
      ],
      countField: "count",
      delta: BigInt(delta),
      removeAtZero: true,
    },
  };
}

export const guest = {
  init(params) {
    bounds = parseParams(params);
  },

  reads() {
    return { embedding: true, metadata: false, document: false };
  },

  deltas(change) {
    if (bounds === null) throw fail("norm_guard: deltas called before init");
    const was = side(change.before);
    const is = side(change.after);
    if (was === is) return [];
    const out = [];
    // Sorted by output id: "above" < "below".
    for (const id of ["above", "below"]) {
      const delta = (is === id ? 1 : 0) - (was === id ? 1 : 0);
      if (delta !== 0) out.push(counter(id, delta));
    }
    return out;
  },
};
