//! Connection preflight: before a command starts its real clients, one short-lived client
//! fetches the cluster metadata and captures what librdkafka reports through its error
//! and log callbacks. Wrong credentials, an untrusted certificate or an unreachable
//! broker then fail the command within seconds, with a message naming the cause and the
//! fix — instead of librdkafka's silent reconnect loop.
//!
//! Authentication and TLS failures are final at the first report (retrying cannot fix a
//! wrong password); an unreachable broker is retried until the timeout.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError as RdError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer as _, ProducerContext};
use rdkafka::ClientContext;
use tracing::debug;

use super::{ClientSettings, KafkaError};

/// Why the preflight failed, classified from librdkafka's reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// SASL authentication was refused (wrong user or password, unknown mechanism).
    Authentication,
    /// The broker's certificate did not verify against the configured CA (or hostname).
    UntrustedCertificate,
    /// Another TLS handshake failure.
    Tls,
    /// The connection was closed during the first request: usually a plaintext client
    /// talking to a TLS/SASL listener (or the reverse).
    ProtocolMismatch,
    /// No broker answered (connection refused, resolution failure, timeout).
    Unreachable,
}

/// Classify one captured librdkafka report (error or log line). `None`: not decisive.
pub fn classify(report: &str) -> Option<Cause> {
    let r = report.to_ascii_lowercase();
    if r.contains("sasl authentication error")
        || r.contains("authentication failed")
        || r.contains("invalid credentials")
        || r.contains("saslauthenticationfailed")
        || r.contains("sasl authentication failed")
        || r.contains("unsupported sasl mechanism")
    {
        return Some(Cause::Authentication);
    }
    if r.contains("certificate verify failed")
        || r.contains("unable to get local issuer certificate")
        || r.contains("self-signed certificate")
        || r.contains("self signed certificate")
        || r.contains("unable to verify the first certificate")
        || r.contains("hostname mismatch")
        || r.contains("ip address mismatch")
    {
        return Some(Cause::UntrustedCertificate);
    }
    if r.contains("ssl handshake failed") || r.contains("ssl transport error") || r.contains("ssl connection") {
        return Some(Cause::Tls);
    }
    if r.contains("incorrect security.protocol") || r.contains("connecting to a ssl listener") {
        return Some(Cause::ProtocolMismatch);
    }
    if r.contains("connection refused")
        || r.contains("all broker connections are down")
        || r.contains("allbrokersdown")
        || r.contains("failed to resolve")
        || r.contains("connect to ipv4")
        || r.contains("timed out")
    {
        return Some(Cause::Unreachable);
    }
    None
}

/// The most telling cause among the captured reports (authentication and TLS first: they
/// also produce "all brokers down" reports).
pub fn decisive_cause(reports: &[String]) -> Option<Cause> {
    let causes: Vec<Cause> = reports.iter().filter_map(|r| classify(r)).collect();
    [Cause::Authentication, Cause::UntrustedCertificate, Cause::Tls, Cause::ProtocolMismatch, Cause::Unreachable]
        .into_iter()
        .find(|c| causes.contains(c))
}

/// The user-facing error for a cause: what failed and how to fix it.
pub fn explain(cause: &Cause, settings: &ClientSettings, detail: &str) -> KafkaError {
    let get = |k: &str| settings.librdkafka.get(k).map(String::as_str);
    let mechanism = get("sasl.mechanisms").or_else(|| get("sasl.mechanism")).unwrap_or("GSSAPI");
    let user = get("sasl.username").unwrap_or("");
    let protocol = get("security.protocol").unwrap_or("plaintext");
    let brokers = &settings.brokers;
    let detail = if detail.is_empty() { String::new() } else { format!(" [librdkafka: {detail}]") };
    match cause {
        Cause::Authentication => KafkaError::Config(format!(
            "authentication failed for user '{user}' (SASL/{mechanism}) at {brokers}: check sasl.username/sasl.password \
             in [librdkafka] or SLUICE_SASL_USERNAME/SLUICE_SASL_PASSWORD{detail}"
        )),
        Cause::UntrustedCertificate => KafkaError::Config(format!(
            "TLS: the certificate of the broker at {brokers} is not trusted (certificate verify failed): set \
             ssl.ca.location in [librdkafka] to the CA that signed it (currently {}){detail}",
            get("ssl.ca.location").map(|p| format!("'{p}'")).unwrap_or_else(|| "unset: the system CAs".into())
        )),
        Cause::Tls => KafkaError::Config(format!(
            "TLS handshake with the broker at {brokers} failed: check security.protocol ({protocol}), ssl.* settings \
             and that the listener speaks TLS{detail}"
        )),
        Cause::ProtocolMismatch => KafkaError::Config(format!(
            "the broker at {brokers} accepts connections but does not answer Kafka requests with \
             security.protocol '{protocol}': a TLS or SASL listener needs security.protocol=SASL_SSL (or SSL, \
             SASL_PLAINTEXT) and the matching sasl.* / ssl.ca.location in [librdkafka]{detail}"
        )),
        Cause::Unreachable => KafkaError::Broker {
            what: format!("connect to {brokers}"),
            message: format!("cannot reach any broker at {brokers}{detail}"),
        },
    }
}

/// Captures librdkafka's error and log reports.
#[derive(Default)]
struct Capture {
    reports: Mutex<Vec<String>>,
}

impl Capture {
    fn push(&self, s: String) {
        debug!(report = %s, "kafka preflight");
        if let Ok(mut r) = self.reports.lock() {
            if r.len() < 64 {
                r.push(s);
            }
        }
    }

    fn snapshot(&self) -> Vec<String> {
        self.reports.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl ClientContext for Capture {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if (level as i32) <= (RDKafkaLogLevel::Warning as i32) {
            self.push(format!("{fac}: {message}"));
        }
    }

    fn error(&self, error: RdError, reason: &str) {
        self.push(format!("{error}: {reason}"));
    }
}

impl ProducerContext for Capture {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// Connect with `settings` and fetch the cluster metadata within `timeout`. On failure the
/// error names the cause (authentication, untrusted certificate, TLS, protocol mismatch,
/// unreachable) and the fix. Blocking: call it from `spawn_blocking` in async code.
/// [`check_connection`] from async code, with the settings' request timeout (at least 1 s).
pub async fn check(settings: &ClientSettings) -> Result<(), KafkaError> {
    let settings = settings.clone();
    let timeout = settings.timeout().max(Duration::from_secs(1));
    tokio::task::spawn_blocking(move || check_connection(&settings, timeout))
        .await
        .map_err(|e| KafkaError::Config(format!("connection check task failed: {e}")))?
}

pub fn check_connection(settings: &ClientSettings, timeout: Duration) -> Result<(), KafkaError> {
    check_connection_once(settings, timeout).map_err(|f| f.error)
}

/// A failed preflight: the error to show, and whether the same check may pass later.
/// It may when no broker answered at all (down, restarting, or too busy to answer within
/// the timeout, which a listener of another protocol cannot be told apart from); it may
/// not when a broker refused (authentication, TLS, a listener that said it speaks
/// another protocol): waiting cannot cure that.
#[derive(Debug)]
pub struct Failure {
    pub error: KafkaError,
    pub may_pass_later: bool,
}

/// [`check_connection_once`] from async code, with the settings' request timeout (at
/// least 1 s).
pub async fn check_once(settings: &ClientSettings) -> Result<(), Failure> {
    let settings = settings.clone();
    let timeout = settings.timeout().max(Duration::from_secs(1));
    tokio::task::spawn_blocking(move || check_connection_once(&settings, timeout)).await.unwrap_or_else(|e| {
        Err(Failure { error: KafkaError::Config(format!("connection check task failed: {e}")), may_pass_later: false })
    })
}

/// [`check_connection`], saying whether a failure may pass later ([`Failure`]).
pub fn check_connection_once(settings: &ClientSettings, timeout: Duration) -> Result<(), Failure> {
    let final_error = |error| Failure { error, may_pass_later: false };
    let mut c = settings.client_config();
    c.set("socket.connection.setup.timeout.ms", timeout.as_millis().clamp(1000, 300_000).to_string())
        .set_log_level(RDKafkaLogLevel::Warning);
    let client: BaseProducer<Capture> =
        c.create_with_context(Capture::default()).map_err(|e| final_error(KafkaError::Config(e.to_string())))?;
    let deadline = Instant::now() + timeout;
    let mut last_error;
    // Short waits first, so that a refusal is reported within a second; longer ones
    // after, so that a broker slower than the first wait to answer (a busy one) can.
    let mut wait = Duration::from_millis(500);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = left.min(wait).max(Duration::from_millis(1));
        wait = (wait * 2).min(Duration::from_secs(4));
        match client.client().fetch_metadata(None, step) {
            Ok(_) => return Ok(()),
            Err(e) => last_error = e.to_string(),
        }
        client.poll(Duration::ZERO); // serves the error callbacks
        let reports = client.context().snapshot();
        if let Some(
            cause @ (Cause::Authentication | Cause::UntrustedCertificate | Cause::Tls | Cause::ProtocolMismatch),
        ) = decisive_cause(&reports)
        {
            return Err(final_error(explain(&cause, settings, &pick_detail(&reports, &cause))));
        }
        if Instant::now() >= deadline {
            let mut cause = decisive_cause(&reports).unwrap_or(Cause::Unreachable);
            if cause == Cause::Unreachable && any_port_open(&settings.brokers) {
                // A listener accepts TCP but never answers a Kafka request: most often a
                // plaintext client on a TLS/SASL listener (librdkafka only reports
                // "all brokers down" then).
                cause = Cause::ProtocolMismatch;
            }
            let mut detail = pick_detail(&reports, &cause);
            if detail.is_empty() {
                detail = format!("no answer within {timeout:?}: {last_error}");
            }
            // No broker answered (what `decisive_cause` found here is at most
            // "unreachable"): it may yet.
            return Err(Failure { error: explain(&cause, settings, &detail), may_pass_later: true });
        }
    }
}

/// Whether a TCP connection to any bootstrap server succeeds.
fn any_port_open(brokers: &str) -> bool {
    use std::net::{TcpStream, ToSocketAddrs};
    brokers.split(',').map(str::trim).filter(|b| !b.is_empty()).any(|b| {
        let hostport = b.rsplit_once("://").map_or(b, |(_, hp)| hp);
        hostport
            .to_socket_addrs()
            .is_ok_and(|mut addrs| addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok()))
    })
}

/// The first report of that cause, shortened, with secrets out of the way (librdkafka
/// never logs the password; the text is bounded anyway).
fn pick_detail(reports: &[String], cause: &Cause) -> String {
    let r = reports.iter().find(|r| classify(r).as_ref() == Some(cause)).cloned().unwrap_or_default();
    let mut s: String = r.chars().take(300).collect();
    if r.chars().count() > 300 {
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_librdkafka_reports() {
        let auth = "FAIL: sasl_ssl://127.0.0.1:29192/bootstrap: SASL authentication error: Authentication failed during \
                    authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 320ms in state AUTH_REQ)";
        assert_eq!(classify(auth), Some(Cause::Authentication));
        let cert = "FAIL: sasl_ssl://127.0.0.1:29192/bootstrap: SSL handshake failed: error:0A000086:SSL routines::\
                    certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is \
                    correctly configured or root CA certificates are installed (install ca-certificates package) \
                    (after 5ms in state SSL_HANDSHAKE)";
        assert_eq!(classify(cert), Some(Cause::UntrustedCertificate));
        let tls = "FAIL: ssl://127.0.0.1:9092/bootstrap: SSL handshake failed: error:0A00010B:SSL routines::wrong version number";
        assert_eq!(classify(tls), Some(Cause::Tls));
        let mismatch = "FAIL: 127.0.0.1:29192/bootstrap: Disconnected while requesting ApiVersion: might be caused by \
                        incorrect security.protocol configuration (connecting to a SSL listener?) or broker version is < 0.10";
        assert_eq!(classify(mismatch), Some(Cause::ProtocolMismatch));
        let refused = "FAIL: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)";
        assert_eq!(classify(refused), Some(Cause::Unreachable));
        assert_eq!(classify("Local: All broker connections are down: 1/1 brokers are down"), Some(Cause::Unreachable));
        assert_eq!(classify("METADATA: something harmless"), None);
    }

    #[test]
    fn authentication_and_tls_win_over_all_brokers_down() {
        let reports = vec![
            "Local: All broker connections are down: 1/1 brokers are down".to_string(),
            "FAIL: SASL authentication error: Authentication failed due to invalid credentials".to_string(),
        ];
        assert_eq!(decisive_cause(&reports), Some(Cause::Authentication));
        let reports = vec![
            "Local: All broker connections are down".to_string(),
            "FAIL: SSL handshake failed: certificate verify failed".to_string(),
        ];
        assert_eq!(decisive_cause(&reports), Some(Cause::UntrustedCertificate));
        assert_eq!(decisive_cause(&["nothing".to_string()]), None);
    }

    #[test]
    fn messages_name_cause_and_fix_without_the_password() {
        let mut s = ClientSettings::new("127.0.0.1:29192");
        s.librdkafka.insert("sasl.username".into(), "bob".into());
        s.librdkafka.insert("sasl.password".into(), "hunter2".into());
        s.librdkafka.insert("sasl.mechanisms".into(), "SCRAM-SHA-512".into());
        s.librdkafka.insert("ssl.ca.location".into(), "/tmp/ca.pem".into());
        let auth = explain(&Cause::Authentication, &s, "").to_string();
        assert!(auth.contains("authentication failed for user 'bob' (SASL/SCRAM-SHA-512)"), "{auth}");
        assert!(auth.contains("SLUICE_SASL_PASSWORD"), "{auth}");
        let cert = explain(&Cause::UntrustedCertificate, &s, "").to_string();
        assert!(
            cert.contains("certificate") && cert.contains("ssl.ca.location") && cert.contains("/tmp/ca.pem"),
            "{cert}"
        );
        let down = explain(&Cause::Unreachable, &s, "").to_string();
        assert!(down.contains("cannot reach any broker at 127.0.0.1:29192"), "{down}");
        for m in [auth, cert, down] {
            assert!(!m.contains("hunter2"), "{m}");
        }
    }

    #[test]
    fn unreachable_broker_fails_within_the_timeout() {
        // Port 1 on loopback: nothing listens, the connection is refused at once.
        let s = ClientSettings::new("127.0.0.1:1");
        let t0 = Instant::now();
        let e = check_connection(&s, Duration::from_secs(2)).unwrap_err().to_string();
        assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
        assert!(e.contains("cannot reach any broker at 127.0.0.1:1"), "{e}");
    }

    #[test]
    fn a_broker_that_does_not_answer_may_answer_later() {
        // Refused: nothing listens.
        let f = check_connection_once(&ClientSettings::new("127.0.0.1:1"), Duration::from_secs(2)).unwrap_err();
        assert!(f.may_pass_later, "{f:?}");
        // Accepted but never answered: a listener of another protocol, or a broker too
        // busy to answer in time. The message names the first; waiting may cure the second.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let held = std::thread::spawn(move || {
            let mut conns = Vec::new();
            silent.set_nonblocking(true).unwrap();
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                if let Ok((c, _)) = silent.accept() {
                    conns.push(c);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let f = check_connection_once(&ClientSettings::new(addr.to_string()), Duration::from_secs(2)).unwrap_err();
        assert!(f.may_pass_later, "{f:?}");
        assert!(f.error.to_string().contains("does not answer Kafka requests"), "{}", f.error);
        held.join().unwrap();
    }
}
