//! The schema registry client (Confluent Schema Registry REST API; Apicurio's `ccompat`
//! API is the same): writer schemas by id for the processor, registration of
//! `schemas/log_record.avsc` for the writers, compatibility checks and version lists for
//! `sluice schema`.
//!
//! Writer schemas are cached by id for the life of the process (an id never changes its
//! schema), parsed once into a [`WriterDecoder`] that knows whether the hand-written codec
//! applies. A registry that cannot be reached, or that does not know an id yet, is a
//! transient condition for the caller: the processor waits and retries its batch.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::config::{Config, SchemaRegistryConfig};
use crate::record::avro::{SchemaId, WriterDecoder, WriterSchemas, LOG_RECORD_SCHEMA_JSON};
use crate::record::framing::{unframe, Framing};

/// The Confluent REST API's media type.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry did not answer, or answered with a server error: try again later.
    #[error("schema registry {url} unreachable: {message}")]
    Unreachable { url: String, message: String },
    /// The registry does not know this schema id (yet).
    #[error("schema registry {url} does not know schema id {id}")]
    UnknownId { url: String, id: SchemaId },
    /// The registry refused the request (incompatible schema, bad credentials, unknown
    /// subject...): trying again does not help.
    #[error("schema registry {url} refused {what}: HTTP {status}: {message}")]
    Refused { url: String, what: String, status: u16, message: String },
    /// The answer did not have the documented shape.
    #[error("schema registry {url}: unexpected answer to {what}: {message}")]
    BadAnswer { url: String, what: String, message: String },
    #[error("invalid [schema_registry] configuration: {0}")]
    Config(String),
}

impl RegistryError {
    /// Whether waiting and asking again may help (the processor then keeps the batch).
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Unreachable { .. } | RegistryError::UnknownId { .. })
    }
}

/// The answer of a compatibility check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compatibility {
    pub is_compatible: bool,
    /// The registry's reasons, when it gives them.
    pub messages: Vec<String>,
}

/// One version of a subject.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SubjectVersion {
    pub subject: String,
    pub version: i64,
    pub id: SchemaId,
    pub schema: String,
}

/// A schema registry client with a cache of parsed writer schemas.
pub struct SchemaRegistry {
    /// The API base, without a trailing slash and without credentials (it is printed).
    base: String,
    http: reqwest::Client,
    username: Option<String>,
    password: Option<String>,
    cache: RwLock<HashMap<SchemaId, Arc<WriterDecoder>>>,
}

impl std::fmt::Debug for SchemaRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaRegistry").field("base", &self.base).finish_non_exhaustive()
    }
}

/// The subject Sluice's log records are registered under: `<topic_prefix>.log-value`
/// (the registry's TopicNameStrategy for the log topic's values).
pub fn log_subject(config: &Config) -> String {
    format!("{}-value", config.kafka.log_topic())
}

impl SchemaRegistry {
    /// The client of the configured registry, `None` without `[schema_registry] url`.
    pub fn from_config(config: &SchemaRegistryConfig) -> Result<Option<SchemaRegistry>, RegistryError> {
        let Some(url) = config.url.as_deref().filter(|u| !u.trim().is_empty()) else {
            return Ok(None);
        };
        let mut parsed =
            reqwest::Url::parse(url.trim()).map_err(|e| RegistryError::Config(format!("url does not parse: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(RegistryError::Config(format!("url scheme {:?} is not http or https", parsed.scheme())));
        }
        // Credentials in the URL work like username/password (the explicit keys win), and
        // never appear in messages.
        let mut username = config.username.clone().filter(|u| !u.is_empty());
        let mut password = config.password.as_ref().map(|p| p.expose().to_string());
        if !parsed.username().is_empty() {
            username = username.or_else(|| Some(parsed.username().to_string()));
            password = password.or_else(|| parsed.password().map(str::to_string));
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &config.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| RegistryError::Config(format!("cannot read ca_file {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| RegistryError::Config(format!("ca_file {}: {e}", ca.display())))?;
            if certs.is_empty() {
                return Err(RegistryError::Config(format!("ca_file {} holds no PEM certificate", ca.display())));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| RegistryError::Config(e.without_url().to_string()))?;
        let base = parsed.as_str().trim_end_matches('/').to_string();
        Ok(Some(SchemaRegistry { base, http, username, password, cache: RwLock::new(HashMap::new()) }))
    }

    /// The API base URL (no credentials).
    pub fn url(&self) -> &str {
        &self.base
    }

    fn unreachable(&self, e: reqwest::Error) -> RegistryError {
        RegistryError::Unreachable { url: self.base.clone(), message: e.without_url().to_string() }
    }

    /// One request; a 2xx answer's JSON body, else the error it means.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
        what: &str,
    ) -> Result<(u16, serde_json::Value), RegistryError> {
        let mut req = self.http.request(method, format!("{}{path}", self.base)).header("Accept", CONTENT_TYPE);
        if let Some(user) = &self.username {
            req = req.basic_auth(user, self.password.as_deref());
        }
        if let Some(body) = body {
            req = req.header("Content-Type", CONTENT_TYPE).body(body.to_string());
        }
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.unreachable(e))?;
        let value: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        if (200..300).contains(&status) {
            return Ok((status, value));
        }
        let message = value
            .get("message")
            .and_then(|m| m.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string().chars().take(500).collect());
        if status >= 500 || status == 429 || status == 408 {
            return Err(RegistryError::Unreachable {
                url: self.base.clone(),
                message: format!("HTTP {status}: {message}"),
            });
        }
        Err(RegistryError::Refused { url: self.base.clone(), what: what.to_string(), status, message })
    }

    fn bad_answer(&self, what: &str, message: impl Into<String>) -> RegistryError {
        RegistryError::BadAnswer { url: self.base.clone(), what: what.into(), message: message.into() }
    }

    /// The cached decoder of writer schema `id`, if it was fetched before.
    pub fn cached(&self, id: SchemaId) -> Option<Arc<WriterDecoder>> {
        self.cache.read().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }

    /// The decoder of writer schema `id`: from the cache, else `GET /schemas/ids/{id}`.
    pub async fn writer_schema(&self, id: SchemaId) -> Result<Arc<WriterDecoder>, RegistryError> {
        if let Some(d) = self.cached(id) {
            return Ok(d);
        }
        let what = format!("schema id {id}");
        let value = match self.call(reqwest::Method::GET, &format!("/schemas/ids/{id}"), None, &what).await {
            Ok((_, v)) => v,
            // 404 (Confluent error code 40403): not registered, or not visible yet.
            Err(RegistryError::Refused { status: 404, .. }) => {
                return Err(RegistryError::UnknownId { url: self.base.clone(), id });
            }
            Err(e) => return Err(e),
        };
        if let Some(t) = value.get("schemaType").and_then(|t| t.as_str()) {
            if !t.eq_ignore_ascii_case("AVRO") {
                let d = Arc::new(WriterDecoder::Incompatible(format!("schema id {id} is a {t} schema, not Avro")));
                return Ok(self.remember(id, d));
            }
        }
        let text = value.get("schema").and_then(|s| s.as_str()).ok_or_else(|| self.bad_answer(&what, "no `schema`"))?;
        let decoder = Arc::new(WriterDecoder::from_json(text));
        tracing::info!(
            schema_id = id,
            decoder = match &*decoder {
                WriterDecoder::Fast => "codec",
                WriterDecoder::Resolve(_) => "resolution",
                WriterDecoder::Incompatible(_) => "incompatible",
            },
            "writer schema fetched from the registry"
        );
        Ok(self.remember(id, decoder))
    }

    fn remember(&self, id: SchemaId, d: Arc<WriterDecoder>) -> Arc<WriterDecoder> {
        self.cache.write().unwrap_or_else(|e| e.into_inner()).entry(id).or_insert(d).clone()
    }

    /// The writer schemas of `ids`, fetched where not cached yet. Fails, as a whole,
    /// when one schema cannot be had: the batch then waits instead of decoding part of it.
    pub async fn writer_schemas(&self, ids: &[SchemaId]) -> Result<WriterSchemas, RegistryError> {
        let mut out = WriterSchemas::with_capacity(ids.len());
        for &id in ids {
            let schema = self.writer_schema(id).await?;
            out.insert(id, schema);
        }
        Ok(out)
    }

    /// Register `schema` under `subject` (`POST /subjects/{subject}/versions`); the
    /// registry answers with the existing id when it has that schema already.
    pub async fn register(&self, subject: &str, schema: &str) -> Result<SchemaId, RegistryError> {
        let what = format!("registering a schema under {subject:?}");
        let (_, v) = self
            .call(
                reqwest::Method::POST,
                &format!("/subjects/{}/versions", encode(subject)),
                Some(json!({ "schema": schema })),
                &what,
            )
            .await?;
        v.get("id")
            .and_then(|i| i.as_u64())
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| self.bad_answer(&what, format!("no schema id in {v}")))
    }

    /// Whether `schema` is compatible (by the subject's compatibility rule) with the
    /// subject's latest version, or with all of them (`all`). A subject without versions
    /// accepts anything.
    pub async fn check_compatibility(
        &self,
        subject: &str,
        schema: &str,
        all: bool,
    ) -> Result<Compatibility, RegistryError> {
        let what = format!("a compatibility check against {subject:?}");
        let path = if all {
            format!("/compatibility/subjects/{}/versions?verbose=true", encode(subject))
        } else {
            format!("/compatibility/subjects/{}/versions/latest?verbose=true", encode(subject))
        };
        match self.call(reqwest::Method::POST, &path, Some(json!({ "schema": schema })), &what).await {
            Ok((_, v)) => {
                let is_compatible = v
                    .get("is_compatible")
                    .and_then(|b| b.as_bool())
                    .ok_or_else(|| self.bad_answer(&what, format!("no is_compatible in {v}")))?;
                let messages = v
                    .get("messages")
                    .and_then(|m| m.as_array())
                    .map(|m| m.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string)).collect())
                    .unwrap_or_default();
                Ok(Compatibility { is_compatible, messages })
            }
            Err(RegistryError::Refused { status: 404, .. }) if self.versions(subject).await?.is_empty() => {
                Ok(Compatibility {
                    is_compatible: true,
                    messages: vec![format!("subject {subject:?} has no versions yet")],
                })
            }
            // Some registries answer an incompatible schema with 409 and the reasons.
            Err(RegistryError::Refused { status: 409 | 422, message, .. }) => {
                Ok(Compatibility { is_compatible: false, messages: vec![message] })
            }
            Err(e) => Err(e),
        }
    }

    /// The subject's version numbers (`GET /subjects/{subject}/versions`); none when the
    /// subject does not exist.
    pub async fn versions(&self, subject: &str) -> Result<Vec<i64>, RegistryError> {
        let what = format!("the versions of {subject:?}");
        match self.call(reqwest::Method::GET, &format!("/subjects/{}/versions", encode(subject)), None, &what).await {
            Ok((_, v)) => serde_json::from_value(v.clone()).map_err(|e| self.bad_answer(&what, format!("{e}: {v}"))),
            Err(RegistryError::Refused { status: 404, .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// One version of a subject (`GET /subjects/{subject}/versions/{version}`).
    pub async fn version(&self, subject: &str, version: i64) -> Result<SubjectVersion, RegistryError> {
        let what = format!("version {version} of {subject:?}");
        let (_, v) = self
            .call(reqwest::Method::GET, &format!("/subjects/{}/versions/{version}", encode(subject)), None, &what)
            .await?;
        serde_json::from_value(v.clone()).map_err(|e| self.bad_answer(&what, format!("{e}: {v}")))
    }
}

/// The distinct writer schema ids the messages name, in first-seen order. Messages
/// without a readable Confluent header name none (decoding sends them to the DLQ).
pub fn schema_ids<'a>(payloads: impl IntoIterator<Item = &'a [u8]>, framing: Framing) -> Vec<SchemaId> {
    let mut ids = Vec::new();
    for p in payloads {
        if let Ok((Some(id), _)) = unframe(framing, p) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

/// A path segment, percent-encoded (subjects may hold any character).
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs `op` until it succeeds, fails for good, or `attempts` transient failures passed,
/// waiting between attempts as the retry policy says.
pub async fn retrying<T, F, Fut>(attempts: usize, mut op: F) -> Result<T, RegistryError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, RegistryError>>,
{
    let mut delays = crate::retry::backoff(Duration::from_millis(200), Duration::from_secs(3));
    let mut tried = 0;
    loop {
        match op().await {
            Err(e) if e.is_transient() && tried + 1 < attempts => {
                tried += 1;
                tracing::warn!(error = %e, attempt = tried, "schema registry request failed; retrying");
                tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(3))).await;
            }
            other => return other,
        }
    }
}

/// With a registry configured: register (or find) `schemas/log_record.avsc` under
/// [`log_subject`] and record its id in the configuration, so that every writer frames
/// its records with the registry's id (`Config::writer_schema_id`). Without one: nothing.
pub async fn prepare_writer(config: &mut Config) -> Result<(), RegistryError> {
    let Some(registry) = SchemaRegistry::from_config(&config.schema_registry)? else {
        return Ok(());
    };
    let subject = log_subject(config);
    let id = retrying(5, || registry.register(&subject, LOG_RECORD_SCHEMA_JSON)).await?;
    tracing::info!(subject = %subject, schema_id = id, registry = registry.url(), "log record schema registered");
    config.schema_registry.writer_schema_id = Some(id);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn cfg(url: &str) -> SchemaRegistryConfig {
        SchemaRegistryConfig { url: Some(url.into()), ..Default::default() }
    }

    #[test]
    fn no_url_no_client_and_bad_urls_are_config_errors() {
        assert!(SchemaRegistry::from_config(&SchemaRegistryConfig::default()).unwrap().is_none());
        assert!(matches!(SchemaRegistry::from_config(&cfg("ftp://x")), Err(RegistryError::Config(_))));
        assert!(matches!(SchemaRegistry::from_config(&cfg("not a url")), Err(RegistryError::Config(_))));
        let missing = SchemaRegistryConfig { ca_file: Some("/nonexistent/ca.pem".into()), ..cfg("https://r") };
        assert!(matches!(SchemaRegistry::from_config(&missing), Err(RegistryError::Config(_))));
    }

    #[test]
    fn credentials_in_the_url_never_show_and_explicit_ones_win() {
        let r = SchemaRegistry::from_config(&cfg("http://u:hunter2@127.0.0.1:1/apis/ccompat/v7/")).unwrap().unwrap();
        assert_eq!(r.url(), "http://127.0.0.1:1/apis/ccompat/v7");
        assert_eq!((r.username.as_deref(), r.password.as_deref()), (Some("u"), Some("hunter2")));
        assert!(!format!("{r:?}").contains("hunter2"));
        let explicit = SchemaRegistryConfig {
            username: Some("me".into()),
            password: Some(Secret::new("pw")),
            ..cfg("http://u:hunter2@127.0.0.1:1")
        };
        let r = SchemaRegistry::from_config(&explicit).unwrap().unwrap();
        assert_eq!((r.username.as_deref(), r.password.as_deref()), (Some("me"), Some("pw")));
    }

    #[tokio::test]
    async fn an_unreachable_registry_is_transient_and_names_no_secret() {
        // Port 1 on loopback: connection refused at once.
        let r = SchemaRegistry::from_config(&cfg("http://u:hunter2@127.0.0.1:1")).unwrap().unwrap();
        let e = r.writer_schema(7).await.unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert!(r.cached(7).is_none(), "a failure is not cached");
        let e = r.writer_schemas(&[7]).await.unwrap_err();
        assert!(e.is_transient());
        assert!(r.writer_schemas(&[]).await.unwrap().is_empty());
    }

    /// A one-connection-at-a-time HTTP server answering every request with `answer`;
    /// returns its URL and the requests it saw.
    fn fake_registry(answer: &'static str) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://127.0.0.1:{}/api", listener.local_addr().unwrap().port());
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { break };
                let mut buf = vec![0u8; 65536];
                let n = conn.read(&mut buf).unwrap_or(0);
                log.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn fetches_with_basic_auth_once_per_id_and_picks_the_decoder() {
        let answer =
            r#"{"schema": "{\"type\":\"record\",\"name\":\"X\",\"fields\":[{\"name\":\"n\",\"type\":\"int\"}]}"}"#;
        let (url, seen) = fake_registry(answer);
        let config =
            SchemaRegistryConfig { username: Some("user".into()), password: Some(Secret::new("pa:ss")), ..cfg(&url) };
        let r = SchemaRegistry::from_config(&config).unwrap().unwrap();
        let d = r.writer_schema(5).await.unwrap();
        assert!(matches!(*d, WriterDecoder::Incompatible(_)), "{d:?}");
        let again = r.writer_schemas(&[5, 5]).await.unwrap();
        assert!(Arc::ptr_eq(&again[&5], &d), "served from the cache");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "one request for id 5: {seen:?}");
        assert!(seen[0].starts_with("GET /api/schemas/ids/5 "), "{}", seen[0]);
        // base64("user:pa:ss")
        assert!(
            seen[0].contains("authorization: Basic dXNlcjpwYTpzcw==")
                || seen[0].contains("Authorization: Basic dXNlcjpwYTpzcw=="),
            "{}",
            seen[0]
        );
    }

    #[test]
    fn schema_ids_are_the_distinct_ids_of_framed_messages() {
        use crate::record::framing::frame;
        let a = frame(Framing::Confluent, 7, b"x");
        let b = frame(Framing::Confluent, 3, b"y");
        let msgs: [&[u8]; 5] = [&a, b"\x01garbage", &b, &a, b""];
        assert_eq!(schema_ids(msgs, Framing::Confluent), vec![7, 3]);
        assert!(schema_ids(msgs, Framing::Plain).is_empty());
    }

    #[test]
    fn subject_is_the_log_topic_value_subject_and_segments_are_encoded() {
        let mut c = Config::default();
        c.kafka.topic_prefix = "t1".into();
        assert_eq!(log_subject(&c), "t1.log-value");
        assert_eq!(encode("a b/c.d-e_f"), "a%20b%2Fc.d-e_f");
    }
}
