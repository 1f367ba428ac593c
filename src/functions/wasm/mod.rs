//! A user's function as a WebAssembly component of the `sluice:function` world
//! (`schemas/function.wit`), run by wasmtime.
//!
//! * **The world imports nothing.** [`Host::inspect`] refuses a component that imports
//!   anything with a function in it (a WASI clock, random, filesystem, network), listing
//!   the imports, and one whose `guest` export is of another major version, naming both.
//!   A component therefore sees nothing but the change it is given.
//! * **Deterministic limits.** Every call gets `fuel_per_change` fuel (counted in
//!   WebAssembly instructions, so the same change runs out at the same point on every
//!   replica and in every backfill); an instance's memory may grow to `max_memory_bytes`
//!   and no further; NaNs are canonicalized, so float results do not depend on the CPU.
//!   The epoch deadline (`epoch_deadline_ms`, one ticker thread per [`Host`]) is the
//!   wall-clock backstop for a host that is too slow, and the one limit that can fail a
//!   change on one machine and not on another.
//! * **One instance per function per worker**, reused across changes: a component built
//!   with componentize-py embeds CPython (about 18 MB), which is far too much to
//!   instantiate per change. [`WasmFunction`] holds its store behind a mutex.
//! * **Failure is sticky.** The first trap, exhausted limit or `Err` from `deltas` is a
//!   [`FunctionFailure`]; the instance is not called again (after a trap its state is
//!   undefined), every later call returns the same failure, and the caller marks the
//!   function failed.
//! * **Compiled once.** Compiled components are kept in the [`Host`] by the SHA-256 of
//!   their bytes and, when the host has a cache directory, on disk as
//!   `<sha256>-<engine>.cwasm` (written to a temporary file, then renamed), so a restart
//!   deserializes instead of compiling again. The directory must be as trusted as the
//!   binary: a compiled file is machine code.

mod convert;
mod world;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use thiserror::Error;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Func, Instance, Linker, TypedFunc};
use wasmtime::{Engine, Store, Trap};

use super::{ChangeRef, FailureKind, Function, FunctionFailure, OutputDelta, Reads};
use world::sluice::function::types as wit;

/// The registry name of a WebAssembly function (`functions list` shows it).
pub const NAME: &str = "wasm";
/// Parameter of a `wasm` function: the SHA-256 (hex) of its stored component.
pub const PARAM_SHA256: &str = "sha256";
/// Parameter of a `wasm` function: the JSON text given to `init` (`{}` when none).
pub const PARAM_PARAMS: &str = "params";
/// The package whose `guest` interface a component exports.
pub const PACKAGE: &str = "sluice:function";
/// The version of the world this host runs; components of the same major version are
/// accepted (wasmtime matches exports by semver compatibility).
pub const WORLD_VERSION: &str = "1.0.0";
const MAJOR: u64 = 1;
/// A reason stored in the sysdb is cut to this many bytes.
const MAX_REASON_BYTES: usize = 2000;
/// The epoch ticker's period: the deadline's resolution.
const TICK: Duration = Duration::from_millis(10);

/// The limits of one instance (`[wasm]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Fuel of one call (`init`, `reads` or `deltas` of one change).
    pub fuel_per_change: u64,
    /// Wall-clock bound of one call, in milliseconds.
    pub epoch_deadline_ms: u64,
    /// Linear memory an instance may grow to, in bytes.
    pub max_memory_bytes: usize,
}

impl Limits {
    pub const DEFAULT: Limits =
        Limits { fuel_per_change: 2_000_000_000, epoch_deadline_ms: 10_000, max_memory_bytes: 256 << 20 };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Why a component is refused or cannot run.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WasmError {
    #[error("not a valid WebAssembly component: {0}")]
    Invalid(String),
    #[error(
        "the component imports {}: a Sluice function may import nothing (no WASI clock, random, filesystem, \
         network or stdio), so that every replica computes the same outputs; build it without them \
         (componentize-py: --stub-wasi)",
        .0.join(", ")
    )]
    Imports(Vec<String>),
    #[error(
        "the component exports {found}, but this Sluice runs {PACKAGE}/guest@{WORLD_VERSION} (major version \
         {MAJOR}): build it against schemas/function.wit of version {WORLD_VERSION}"
    )]
    OtherVersion { found: String },
    #[error(
        "the component does not export {PACKAGE}/guest (it exports: {0}): build it for the world `function` of \
         schemas/function.wit"
    )]
    NoGuest(String),
    #[error("the component cannot be instantiated: {0}")]
    Instantiate(String),
    #[error("the component's init refused its parameters: {0}")]
    Init(String),
    #[error("the component failed: {0}")]
    Failed(FunctionFailure),
    #[error("component {sha256}: {message}")]
    Stored { sha256: String, message: String },
    #[error("the WebAssembly engine cannot start: {0}")]
    Engine(String),
}

/// What [`Host::inspect`] found in an accepted component.
#[derive(Clone)]
pub struct Inspected {
    /// SHA-256 of the bytes, lowercase hex: the component's name in the sysdb.
    pub sha256: String,
    /// The version of `sluice:function/guest` it exports (e.g. `1.0.0`).
    pub world_version: String,
    pub component: Component,
}

/// The hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// An engine, its epoch ticker and its compiled components.
pub struct Host {
    engine: Engine,
    limits: Limits,
    cache_dir: Option<PathBuf>,
    /// Compiled components by SHA-256.
    compiled: Mutex<HashMap<String, Component>>,
    /// A lock per SHA-256 being compiled: a second caller (another partition's worker,
    /// the start-up compile) waits for the first instead of compiling the same bytes
    /// again, which for an interpreter's component is tens of seconds of a core.
    compiling: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Components compiled by this host (not taken from a cache).
    compilations: AtomicU64,
    /// Disk cache key of this engine's compiled code.
    engine_key: String,
    stop: Arc<AtomicBool>,
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

static GLOBAL: OnceLock<Host> = OnceLock::new();

impl Host {
    /// A host with `limits` for the instances it creates and compiled components cached
    /// in `cache_dir` (created if missing; `None`: in memory only).
    pub fn new(limits: Limits, cache_dir: Option<PathBuf>) -> Result<Host, WasmError> {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(true);
        config.epoch_interruption(true);
        config.cranelift_nan_canonicalization(true);
        let engine = Engine::new(&config).map_err(|e| WasmError::Engine(e.to_string()))?;
        let engine_key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut h);
            format!("{:016x}", h.finish())
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (ticker, stopped) = (engine.clone(), stop.clone());
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    ticker.increment_epoch();
                }
            })
            .map_err(|e| WasmError::Engine(format!("cannot start the epoch ticker thread: {e}")))?;
        if let Some(dir) = &cache_dir {
            if let Err(e) = std::fs::create_dir_all(dir) {
                tracing::warn!(dir = %dir.display(), %e, "cannot create the compiled-component cache; compiling in memory only");
            }
        }
        Ok(Host {
            engine,
            limits,
            cache_dir,
            compiled: Mutex::new(HashMap::new()),
            compiling: Mutex::new(HashMap::new()),
            compilations: AtomicU64::new(0),
            engine_key,
            stop,
        })
    }

    /// Set the process's host ([`Host::global`]) before its first use; a second call
    /// changes nothing and says so.
    pub fn configure(limits: Limits, cache_dir: Option<PathBuf>) -> Result<(), WasmError> {
        if let Some(h) = GLOBAL.get() {
            if h.limits != limits || h.cache_dir != cache_dir {
                tracing::warn!("the WebAssembly host is configured already; the new settings apply after a restart");
            }
            return Ok(());
        }
        let host = Host::new(limits, cache_dir)?;
        let _ = GLOBAL.set(host);
        Ok(())
    }

    /// The process's host: the one [`Host::configure`] set, else one with the default
    /// limits and a cache in the temporary directory.
    pub fn global() -> Result<&'static Host, WasmError> {
        if let Some(h) = GLOBAL.get() {
            return Ok(h);
        }
        let host = Host::new(Limits::DEFAULT, Some(default_cache_dir(None)))?;
        let _ = GLOBAL.set(host);
        GLOBAL.get().ok_or_else(|| WasmError::Engine("the WebAssembly host was not set".into()))
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn cache_path(&self, sha256: &str) -> Option<PathBuf> {
        self.cache_dir.as_ref().map(|d| d.join(format!("{sha256}-{}.cwasm", self.engine_key)))
    }

    /// The compiled component of `sha256` if this host has it, in memory or on disk.
    pub fn cached(&self, sha256: &str) -> Option<Component> {
        if let Some(c) = self.compiled.lock().unwrap_or_else(|p| p.into_inner()).get(sha256) {
            return Some(c.clone());
        }
        let path = self.cache_path(sha256)?;
        if !path.exists() {
            return None;
        }
        // SAFETY: the file was written by `Component::serialize` of an engine with the
        // same compatibility hash (it is in the name) into the cache directory, which is
        // as trusted as the binary (module doc); wasmtime checks the header again.
        match unsafe { Component::deserialize_file(&self.engine, &path) } {
            Ok(c) => {
                self.compiled.lock().unwrap_or_else(|p| p.into_inner()).insert(sha256.to_string(), c.clone());
                Some(c)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), %e, "compiled component unreadable; compiling again");
                None
            }
        }
    }

    /// Compile `bytes` (or take the compiled copy of the same SHA-256), keeping it in
    /// memory and on disk. Returns the SHA-256 and the component.
    pub fn compile(&self, bytes: &[u8]) -> Result<(String, Component), WasmError> {
        let sha256 = sha256_hex(bytes);
        if let Some(c) = self.cached(&sha256) {
            return Ok((sha256, c));
        }
        self.in_turn(&sha256, || match self.cached(&sha256) {
            // Whoever held the turn before may have compiled it.
            Some(c) => Ok(c),
            None => self.compile_new(&sha256, bytes, true),
        })
        .map(|c| (sha256, c))
    }

    /// Whether this host has `sha256` compiled, in memory or on disk, without loading it.
    pub fn is_cached(&self, sha256: &str) -> bool {
        self.compiled.lock().unwrap_or_else(|p| p.into_inner()).contains_key(sha256)
            || self.cache_path(sha256).is_some_and(|p| p.exists())
    }

    /// Compile `bytes` into the disk cache only (kept in memory when the host has no disk
    /// cache), unless compiled already: ahead of a use that may not come to this process,
    /// whose memory holds only what it runs. Returns the SHA-256.
    pub fn precompile(&self, bytes: &[u8]) -> Result<String, WasmError> {
        let sha256 = sha256_hex(bytes);
        if self.is_cached(&sha256) {
            return Ok(sha256);
        }
        let in_memory = self.cache_dir.is_none();
        self.in_turn(&sha256, || {
            if self.is_cached(&sha256) {
                return Ok(());
            }
            self.compile_new(&sha256, bytes, in_memory).map(drop)
        })?;
        Ok(sha256)
    }

    /// `f` in the compile turn of `sha256`: one caller at a time per hash.
    fn in_turn<R>(&self, sha256: &str, f: impl FnOnce() -> R) -> R {
        let turn =
            self.compiling.lock().unwrap_or_else(|p| p.into_inner()).entry(sha256.to_string()).or_default().clone();
        let result = {
            let _turn = turn.lock().unwrap_or_else(|p| p.into_inner());
            f()
        };
        // The turn goes when no one holds it: clones are made only under the map's lock, so
        // a count of one (the map's) seen under it stays one.
        drop(turn);
        let mut compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
        if compiling.get(sha256).is_some_and(|t| Arc::strong_count(t) == 1) {
            compiling.remove(sha256);
        }
        result
    }

    /// The number of components this host compiled itself (cache hits not counted).
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    fn compile_new(&self, sha256: &str, bytes: &[u8], keep_in_memory: bool) -> Result<Component, WasmError> {
        let component = Component::new(&self.engine, bytes).map_err(|e| WasmError::Invalid(chain(&e)))?;
        self.compilations.fetch_add(1, Ordering::Relaxed);
        if let Some(path) = self.cache_path(sha256) {
            if let Err(e) = write_atomically(&path, &component) {
                tracing::warn!(path = %path.display(), %e, "cannot write the compiled component to the cache");
            }
        }
        if keep_in_memory {
            self.compiled.lock().unwrap_or_else(|p| p.into_inner()).insert(sha256.to_string(), component.clone());
        }
        Ok(component)
    }

    /// Compile `bytes` and check that the component fits the world: it imports nothing
    /// but types, and exports `sluice:function/guest` of major version 1.
    pub fn inspect(&self, bytes: &[u8]) -> Result<Inspected, WasmError> {
        if !wasmparser_is_component(bytes) {
            return Err(WasmError::Invalid(
                "the file is not a component (a core module, or not WebAssembly): build it as a component of the \
                 world `function` (componentize-py componentize, jco componentize, wasm-tools component new)"
                    .into(),
            ));
        }
        let (sha256, component) = self.compile(bytes)?;
        let ty = component.component_type();
        let imports: Vec<String> = ty
            .imports(&self.engine)
            .filter(|(_, e)| !types_only(&e.ty, &self.engine))
            .map(|(name, _)| name.to_string())
            .collect();
        if !imports.is_empty() {
            return Err(WasmError::Imports(imports));
        }
        let exports: Vec<String> = ty.exports(&self.engine).map(|(name, _)| name.to_string()).collect();
        let prefix = format!("{PACKAGE}/guest");
        let guest = exports.iter().find(|n| n.as_str() == prefix || n.starts_with(&format!("{prefix}@")));
        let Some(guest) = guest else {
            return Err(WasmError::NoGuest(if exports.is_empty() { "nothing".into() } else { exports.join(", ") }));
        };
        let version = guest.strip_prefix(&format!("{prefix}@")).unwrap_or("");
        let major = version.split('.').next().and_then(|m| m.parse::<u64>().ok());
        if major != Some(MAJOR) {
            return Err(WasmError::OtherVersion { found: guest.clone() });
        }
        Ok(Inspected { sha256, world_version: version.to_string(), component })
    }

    /// A new instance of `component`, initialised with `params` (JSON text), with this
    /// host's limits.
    pub fn instantiate(&self, sha256: &str, component: &Component, params: &str) -> Result<WasmFunction, WasmError> {
        self.instantiate_with(sha256, component, params, self.limits)
    }

    /// [`Host::instantiate`] with other limits (tests).
    pub fn instantiate_with(
        &self,
        sha256: &str,
        component: &Component,
        params: &str,
        limits: Limits,
    ) -> Result<WasmFunction, WasmError> {
        let mut store = Store::new(
            &self.engine,
            State { limiter: Limiter { max: limits.max_memory_bytes, refused: None, table_max: 1_000_000 } },
        );
        store.limiter(|s| &mut s.limiter);
        arm(&mut store, limits)?;
        // A component that imports only types needs nothing from the linker.
        let linker: Linker<State> = Linker::new(&self.engine);
        let instantiated = linker.instantiate(&mut store, component).and_then(|instance| {
            let bound = world::Function::new(&mut store, &instance)?;
            let deltas = deltas_func(&mut store, &instance)?;
            Ok((bound, deltas))
        });
        let (bound, deltas) = match instantiated {
            Ok(b) => b,
            Err(e) => {
                return Err(match classify(&mut store, &e, limits) {
                    Some(f) => WasmError::Failed(f),
                    None => WasmError::Instantiate(chain(&e)),
                })
            }
        };
        let mut inner = Inner { store, bound, deltas, limits, failed: None };
        let guest = inner.bound.sluice_function_guest().clone();
        match inner.call(|store| guest.call_init(store, params)) {
            Ok(Ok(())) => {}
            Ok(Err(text)) => return Err(WasmError::Init(cut(text))),
            Err(f) => return Err(WasmError::Failed(f)),
        }
        let reads = match inner.call(|store| guest.call_reads(store)) {
            Ok(fields) => convert::reads(fields),
            Err(f) => return Err(WasmError::Failed(f)),
        };
        Ok(WasmFunction { sha256: sha256.to_string(), reads, inner: Mutex::new(inner) })
    }
}

/// The argument and result of `deltas`, called with the change borrowed from the stored
/// records ([`convert::ChangeArg`]) rather than through the generated bindings, which take
/// owned copies.
type DeltasParams<'a> = (convert::ChangeArg<'a>,);
type DeltasResults = (Result<Vec<wit::OutputDelta>, String>,);

/// The guest's `deltas`, its types checked against [`DeltasParams`] and
/// [`DeltasResults`] (which [`Inner::deltas`] relies on).
fn deltas_func(store: &mut Store<State>, instance: &Instance) -> wasmtime::Result<Func> {
    let guest = format!("{PACKAGE}/guest@{WORLD_VERSION}");
    let missing = || wasmtime::format_err!("the component does not export {guest}#deltas");
    let interface = instance.get_export_index(&mut *store, None, &guest).ok_or_else(missing)?;
    let index = instance.get_export_index(&mut *store, Some(&interface), "deltas").ok_or_else(missing)?;
    let func = instance.get_func(&mut *store, index).ok_or_else(missing)?;
    func.typed::<DeltasParams<'static>, DeltasResults>(&*store)?;
    Ok(func)
}

/// The default cache directory: beside a SQLite sysdb file (`<file>.wasm-cache`), else
/// `sluice-wasm-cache` in the temporary directory.
pub fn default_cache_dir(sqlite_file: Option<&Path>) -> PathBuf {
    match sqlite_file {
        Some(f) => {
            let mut name = f.file_name().map(|n| n.to_os_string()).unwrap_or_default();
            name.push(".wasm-cache");
            f.with_file_name(name)
        }
        None => std::env::temp_dir().join("sluice-wasm-cache"),
    }
}

fn write_atomically(path: &Path, component: &Component) -> Result<(), String> {
    let bytes = component.serialize().map_err(|e| e.to_string())?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        e.to_string()
    })
}

/// Whether `bytes` start like a component (the layer field of the preamble is 1).
fn wasmparser_is_component(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[6..8] == [1, 0]
}

/// An import that brings only types (an interface of the world whose types the guest
/// uses): nothing callable, nothing to provide.
fn types_only(item: &ComponentItem, engine: &Engine) -> bool {
    match item {
        ComponentItem::Type(_) => true,
        ComponentItem::ComponentInstance(i) => i.exports(engine).all(|(_, e)| matches!(e.ty, ComponentItem::Type(_))),
        _ => false,
    }
}

/// An error and its causes, on one line.
fn chain(e: &wasmtime::Error) -> String {
    cut(e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": "))
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_REASON_BYTES {
        let mut at = MAX_REASON_BYTES;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push('…');
    }
    s
}

/// What a store carries: the memory limiter, which remembers what it refused.
struct State {
    limiter: Limiter,
}

struct Limiter {
    max: usize,
    table_max: usize,
    /// The size a refused growth asked for.
    refused: Option<usize>,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max {
            self.refused = Some(desired);
            return Err(wasmtime::format_err!("memory limit of {} bytes exceeded (asked for {desired})", self.max));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= self.table_max)
    }
}

/// Fuel and deadline for the next call.
fn arm(store: &mut Store<State>, limits: Limits) -> Result<(), WasmError> {
    store.set_fuel(limits.fuel_per_change).map_err(|e| WasmError::Engine(chain(&e)))?;
    let ticks = limits.epoch_deadline_ms.div_ceil(TICK.as_millis() as u64).max(1) + 1;
    store.set_epoch_deadline(ticks);
    Ok(())
}

/// The failure behind a call's error (`None`: not a failure of the guest's own doing).
fn classify(store: &mut Store<State>, e: &wasmtime::Error, limits: Limits) -> Option<FunctionFailure> {
    if let Some(asked) = store.data_mut().limiter.refused.take() {
        return Some(FunctionFailure {
            kind: FailureKind::Memory,
            reason: format!(
                "memory limit exceeded: the instance asked for {asked} bytes of linear memory, \
                 wasm.max_memory_bytes is {} (raise it, or make the function use less)",
                limits.max_memory_bytes
            ),
        });
    }
    let trap = e.downcast_ref::<Trap>().copied();
    Some(match trap {
        Some(Trap::OutOfFuel) => FunctionFailure {
            kind: FailureKind::Fuel,
            reason: format!(
                "fuel exhausted: one call needed more than wasm.fuel_per_change = {} (an endless loop, or \
                 raise the limit); deterministic, so every replica fails this change alike",
                limits.fuel_per_change
            ),
        },
        Some(Trap::Interrupt) => FunctionFailure {
            kind: FailureKind::Deadline,
            reason: format!(
                "wall-clock deadline passed: one call ran longer than wasm.epoch_deadline_ms = {} ms",
                limits.epoch_deadline_ms
            ),
        },
        Some(t) => FunctionFailure { kind: FailureKind::Trap, reason: cut(format!("trap: {t} ({})", chain(e))) },
        None => FunctionFailure { kind: FailureKind::Trap, reason: cut(format!("trap: {}", chain(e))) },
    })
}

struct Inner {
    store: Store<State>,
    bound: world::Function,
    /// The guest's `deltas` ([`deltas_func`]).
    deltas: Func,
    limits: Limits,
    failed: Option<FunctionFailure>,
}

impl Inner {
    /// One call with fresh fuel and deadline; a failure is remembered (sticky).
    fn call<R>(&mut self, f: impl FnOnce(&mut Store<State>) -> wasmtime::Result<R>) -> Result<R, FunctionFailure> {
        if let Some(failed) = &self.failed {
            return Err(failed.clone());
        }
        let limits = self.limits;
        let result = arm(&mut self.store, limits)
            .map_err(|e| FunctionFailure { kind: FailureKind::Trap, reason: e.to_string() })
            .and_then(|()| {
                f(&mut self.store).map_err(|e| {
                    classify(&mut self.store, &e, limits)
                        .unwrap_or(FunctionFailure { kind: FailureKind::Trap, reason: chain(&e) })
                })
            });
        if let Err(f) = &result {
            self.failed = Some(f.clone());
        }
        result
    }
}

/// A component instance as a [`Function`].
pub struct WasmFunction {
    sha256: String,
    reads: Reads,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for WasmFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmFunction").field("sha256", &self.sha256).field("reads", &self.reads).finish()
    }
}

impl WasmFunction {
    /// The SHA-256 of the component it runs.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The failure that stopped it, if any.
    pub fn failure(&self) -> Option<FunctionFailure> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).failed.clone()
    }

    /// One call of the guest's `reads` as `deltas` is called (the lock, the fuel and
    /// deadline armed, the entry): what a call costs with nothing to lower or lift (the
    /// cost test's measure of what batching calls could save).
    #[cfg(test)]
    pub(crate) fn call_reads(&self) -> Result<Reads, FunctionFailure> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let guest = inner.bound.sluice_function_guest().clone();
        inner.call(|store| guest.call_reads(store)).map(convert::reads)
    }
}

impl Function for WasmFunction {
    fn name(&self) -> &'static str {
        NAME
    }

    fn reads(&self) -> Reads {
        self.reads
    }

    /// Without a way to fail: a failure emits nothing (and is logged); the processor and
    /// the backfill call [`Function::try_deltas`].
    fn deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) {
        if let Err(f) = self.try_deltas(change, out) {
            tracing::error!(component = %self.sha256, reason = %f.reason, "WebAssembly function failed");
        }
    }

    fn try_deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) -> Result<(), FunctionFailure> {
        let arg = convert::change(change, self.reads);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `deltas_func` checked these types (`'static` in place of `'_`: the
        // lifetime is not part of the component type) against the component's `deltas`.
        let typed = unsafe { TypedFunc::<DeltasParams<'_>, DeltasResults>::new_unchecked(inner.deltas) };
        let returned = inner.call(|store| typed.call(store, (arg,)).map(|(r,)| r))?;
        let deltas = match returned {
            Ok(d) => d,
            Err(text) => {
                let f = FunctionFailure {
                    kind: FailureKind::Error,
                    reason: cut(format!("the function returned an error for record {:?}: {text}", change.id)),
                };
                inner.failed = Some(f.clone());
                return Err(f);
            }
        };
        let start = out.len();
        if let Err(text) = convert::deltas_back(deltas, change.offset, out) {
            out.truncate(start);
            let f = FunctionFailure {
                kind: FailureKind::Error,
                reason: cut(format!("the function's output for record {:?} is refused: {text}", change.id)),
            };
            inner.failed = Some(f.clone());
            return Err(f);
        }
        Ok(())
    }
}

/// The parameters of an attached `wasm` function: `(sha256, init params JSON)`.
pub fn params_of(params: &std::collections::BTreeMap<String, String>) -> Result<(&str, &str), String> {
    let sha = params
        .get(PARAM_SHA256)
        .ok_or_else(|| format!("a {NAME} function needs the parameter {PARAM_SHA256} (its component's hash)"))?;
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return Err(format!("{PARAM_SHA256} {sha:?} is not a lowercase hex SHA-256"));
    }
    if let Some(k) = params.keys().find(|k| *k != PARAM_SHA256 && *k != PARAM_PARAMS) {
        return Err(format!("unknown parameter {k:?} of a {NAME} function (only {PARAM_SHA256} and {PARAM_PARAMS})"));
    }
    Ok((sha.as_str(), params.get(PARAM_PARAMS).map(String::as_str).unwrap_or("{}")))
}

#[cfg(test)]
pub(crate) mod tests;
