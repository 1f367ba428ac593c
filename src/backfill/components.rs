//! Attached functions built from their rows, and WebAssembly components checked and
//! stored at attach (`src/functions/wasm/`).
//!
//! A `wasm` function's row names its component by SHA-256 (`params.sha256`) and carries
//! the JSON text given to its `init` (`params.params`). Every replica and the backfill
//! worker load the bytes from the sysdb by that hash (or the compiled copy their host
//! keeps by the same hash), never from a file, so all of them run the same code.
//!
//! Attach checks a component twice: when its bytes are stored (it parses, imports
//! nothing, exports `sluice:function/guest@1.*`) and when a function is attached with
//! it (an instance accepts its parameters in `init`, and runs an insert and a removal of
//! a sample record without failing).

use std::sync::Arc;

use thiserror::Error;

use crate::functions::wasm::{self, Host, WasmError};
use crate::functions::{build, ChangeRef, Function, FunctionError};
use crate::record::{Embedding, MetaValue, Metadata, Record};
use crate::sysdb::{FunctionRow, Sysdb, SysdbError};

/// Why an attached function cannot be built.
#[derive(Debug, Error)]
pub(crate) enum BuildError {
    /// A built-in's name or parameters are wrong (the attach checked them: a bug or a
    /// row written by another release).
    #[error(transparent)]
    Function(#[from] FunctionError),
    /// The sysdb could not be read: try again later.
    #[error(transparent)]
    Sysdb(#[from] SysdbError),
    /// The component cannot run here, and would not on another try (deterministic): the
    /// function is to be marked failed with this reason.
    #[error("{0}")]
    Component(String),
}

/// What storing a component found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct StoredComponent {
    pub sha256: String,
    pub size: usize,
    pub world_version: String,
    /// Whether these bytes were new to the sysdb.
    pub new: bool,
}

/// Check `bytes` as a component of the `sluice:function` world and store them in the
/// sysdb under their SHA-256. A refused component is `Err(WasmError)` (its message says
/// why and what to do).
pub(crate) async fn store_component(sysdb: &Sysdb, bytes: Vec<u8>) -> Result<StoredComponent, StoreError> {
    let host = Host::global()?;
    let (bytes, inspected) = tokio::task::spawn_blocking(move || {
        let inspected = host.inspect(&bytes);
        (bytes, inspected)
    })
    .await
    .map_err(|e| StoreError::Wasm(WasmError::Engine(format!("the compiling task failed: {e}"))))?;
    let inspected = inspected?;
    let size = bytes.len();
    let new = sysdb.put_component(&inspected.sha256, bytes, &inspected.world_version).await?;
    Ok(StoredComponent { sha256: inspected.sha256, size, world_version: inspected.world_version, new })
}

#[derive(Debug, Error)]
pub(crate) enum StoreError {
    #[error("component refused: {0}")]
    Wasm(#[from] WasmError),
    #[error(transparent)]
    Sysdb(#[from] SysdbError),
}

/// The compiled component `sha256`: from the host's cache, else from the sysdb's bytes.
async fn component(
    sysdb: &Sysdb,
    host: &'static Host,
    sha256: &str,
) -> Result<wasmtime::component::Component, BuildError> {
    let sha = sha256.to_string();
    if let Some(c) = tokio::task::spawn_blocking(move || host.cached(&sha)).await.ok().flatten() {
        return Ok(c);
    }
    let bytes = sysdb.component(sha256).await?.ok_or_else(|| {
        BuildError::Component(format!(
            "component {sha256} is not stored in the sysdb (attach stores it first: attach the function again)"
        ))
    })?;
    let compiled = tokio::task::spawn_blocking(move || host.compile(&bytes))
        .await
        .map_err(|e| BuildError::Component(format!("compiling component {sha256} failed: {e}")))?
        .map_err(|e| BuildError::Component(e.to_string()))?;
    if compiled.0 != sha256 {
        return Err(BuildError::Component(format!(
            "the bytes stored as component {sha256} have the SHA-256 {}: the sysdb row is corrupt",
            compiled.0
        )));
    }
    Ok(compiled.1)
}

/// A new instance of the `wasm` function with these parameters.
async fn instantiate(
    sysdb: &Sysdb,
    params: &std::collections::BTreeMap<String, String>,
) -> Result<wasm::WasmFunction, BuildError> {
    let (sha256, init) = wasm::params_of(params).map_err(BuildError::Component)?;
    let host = Host::global().map_err(|e| BuildError::Component(e.to_string()))?;
    let component = component(sysdb, host, sha256).await?;
    let (sha256, init) = (sha256.to_string(), init.to_string());
    tokio::task::spawn_blocking(move || host.instantiate(&sha256, &component, &init))
        .await
        .map_err(|e| BuildError::Component(format!("instantiating the component failed: {e}")))?
        .map_err(|e| BuildError::Component(e.to_string()))
}

/// The function an attached row runs: a built-in by name, a `wasm` function as a new
/// instance of its stored component (one per caller: a worker keeps it across changes).
pub(crate) async fn build_function(sysdb: &Sysdb, row: &FunctionRow) -> Result<Arc<dyn Function>, BuildError> {
    if row.function == wasm::NAME {
        return Ok(Arc::new(instantiate(sysdb, &row.params).await?));
    }
    Ok(Arc::from(build(&row.function, &row.params)?))
}

/// Check at attach that the `wasm` function with `params` runs: its component is
/// stored, an instance accepts the parameters, and an insert and a removal of a sample
/// record run without failing. `Err` is the message of the refusal.
pub(crate) async fn check_function(
    sysdb: &Sysdb,
    params: &std::collections::BTreeMap<String, String>,
) -> Result<(), BuildError> {
    let f = instantiate(sysdb, params).await?;
    tokio::task::spawn_blocking(move || {
        let sample = sample_record();
        let mut out = Vec::new();
        f.try_deltas(&ChangeRef { id: &sample.id, before: None, after: Some(&sample), offset: 0 }, &mut out)
            .and_then(|()| {
                out.clear();
                f.try_deltas(&ChangeRef { id: &sample.id, before: Some(&sample), after: None, offset: 1 }, &mut out)
            })
            .map_err(|failure| {
                BuildError::Component(format!("on a sample change (an insert, then a removal): {failure}"))
            })
    })
    .await
    .map_err(|e| BuildError::Component(format!("the sample run failed: {e}")))?
}

/// Compile, ahead of their first batch, the components of every WebAssembly function
/// still running (not detached, not failed) that this process's host has in no cache, one
/// at a time, until `stop`. A replica starts this beside joining its group: a component
/// compiled here is what a worker's first batch of that collection would otherwise wait
/// for (the host compiles each hash once, so a worker that comes first is waited for
/// instead). It fills the disk cache only: the replica does not know yet which partitions
/// it gets, and its memory keeps only the components their functions run (the memory
/// formula's `K`). Failures are left to the worker that builds the function (it marks the
/// function failed); a sysdb that cannot be read now is logged and skipped.
pub(crate) async fn compile_ahead(sysdb: Arc<Sysdb>, stop: tokio_util::sync::CancellationToken) {
    use crate::functions::FunctionStatus;
    let Ok(host) = Host::global() else { return };
    let rows = match sysdb.functions(None).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the attached functions to compile their components ahead");
            return;
        }
    };
    let mut hashes: Vec<String> = rows
        .iter()
        .filter(|r| r.function == wasm::NAME && !matches!(r.status, FunctionStatus::Detached | FunctionStatus::Failed))
        .filter_map(|r| wasm::params_of(&r.params).ok().map(|(sha, _)| sha.to_string()))
        .collect();
    hashes.sort_unstable();
    hashes.dedup();
    for sha in hashes {
        if stop.is_cancelled() {
            return;
        }
        if host.is_cached(&sha) {
            continue;
        }
        let started = std::time::Instant::now();
        let bytes = match sysdb.component(&sha).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue, // the worker that builds the function says so
            Err(e) => {
                tracing::warn!(component = %sha, error = %e, "cannot read a component to compile it ahead");
                continue;
            }
        };
        match tokio::task::spawn_blocking(move || host.precompile(&bytes)).await {
            Ok(Ok(got)) if got == sha => tracing::info!(
                component = %sha,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "component compiled ahead of its functions' first batch"
            ),
            Ok(Ok(got)) => {
                tracing::warn!(component = %sha, found = %got, "the bytes stored as this component have another hash")
            }
            Ok(Err(e)) => tracing::warn!(component = %sha, error = %e, "cannot compile a component ahead"),
            Err(e) => tracing::warn!(component = %sha, error = %e, "the compile-ahead task failed"),
        }
    }
}

/// The record of the sample changes run at attach.
fn sample_record() -> Record {
    Record {
        id: "sluice-attach-sample".into(),
        embedding: Some(Embedding::from_f32s(&[0.6, 0.8])),
        metadata: Metadata::from_iter([
            ("sample".to_string(), MetaValue::String("yes".into())),
            ("n".to_string(), MetaValue::Long(1)),
        ]),
        document: Some("a sample record".into()),
        offset: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn params(sha: &str, init: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (wasm::PARAM_SHA256.to_string(), sha.to_string()),
            (wasm::PARAM_PARAMS.to_string(), init.to_string()),
        ])
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn components_are_stored_by_hash_once_checked_and_functions_built_from_the_stored_bytes() {
        let Some(fx) = crate::functions::wasm::tests::fixtures() else { return };
        let (limits, _) = crate::config::Config::default().wasm_host();
        Host::configure(limits, Some(fx.dir.join("cache"))).expect("host");
        let db = Sysdb::open("sqlite::memory:").await.expect("sysdb");
        let bytes = fx.bytes("fixture.wasm");
        let stored = store_component(&db, bytes.clone()).await.expect("stored");
        assert_eq!(stored.sha256, wasm::sha256_hex(&bytes));
        assert!(stored.new && stored.world_version == "1.0.0" && stored.size == bytes.len(), "{stored:?}");
        assert!(!store_component(&db, bytes.clone()).await.expect("again").new, "the same bytes are stored once");
        assert_eq!(db.component(&stored.sha256).await.expect("read").as_deref(), Some(bytes.as_slice()));
        // Refused components are not stored.
        let wasi = fx.bytes("fixture-wasi.wasm");
        assert!(matches!(store_component(&db, wasi.clone()).await, Err(StoreError::Wasm(WasmError::Imports(_)))));
        assert_eq!(db.component(&wasm::sha256_hex(&wasi)).await.expect("read"), None);
        // A function of the stored component runs; bad params or a sample failure refuse it.
        check_function(&db, &params(&stored.sha256, r#"{"mode": "count_by", "key": "sample"}"#)).await.expect("runs");
        let refused = check_function(&db, &params(&stored.sha256, r#"{"mode": "err"}"#)).await.unwrap_err();
        assert!(refused.to_string().contains("sample change"), "{refused}");
        let unknown = check_function(&db, &params(&"0".repeat(64), "{}")).await.unwrap_err();
        assert!(unknown.to_string().contains("not stored in the sysdb"), "{unknown}");
    }
}
