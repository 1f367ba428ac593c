//! The host's bindings of the `sluice:function` world (`schemas/function.wit`),
//! generated at build time: the guest's exports (`init`, `reads`, `deltas`) and the
//! world's types.

wasmtime::component::bindgen!({ path: "schemas/function.wit", world: "function" });
