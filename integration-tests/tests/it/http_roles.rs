//! The API's roles on a real `sluice process` replica against the real broker (the same
//! walk through the router in-process: `src/api/roles_tests.rs`):
//!
//! * every operation of `docs/openapi.yaml`, called with no token, a wrong one, the read
//!   token and the admin token, answers as its `x-sluice-role` says, on a replica with
//!   both tokens and on one with only the read token (which takes no change at all);
//! * a replica whose `http.listen` other machines reach (`0.0.0.0`, `::`) and that has no
//!   token refuses to start, with exit code 2 and a message naming `http.listen`, the
//!   address and the fixes; with `http.allow_unauthenticated` or a token it starts.

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_integration_tests::{free_port, repo_root, require_kafka, Env, Replica};

const WAIT: Duration = Duration::from_secs(120);
const READ: &str = "it-read-token-6a1f0c2d";
const ADMIN: &str = "it-admin-token-93be27f4";

/// An answer: status, `WWW-Authenticate`, JSON body (or Null).
#[derive(Debug)]
struct Answer {
    status: u16,
    challenge: Option<String>,
    body: Value,
}

/// One HTTP/1.1 request to 127.0.0.1:`port`, `None` while nothing listens.
fn request(port: u16, method: &str, path: &str, token: Option<&str>, body: &str) -> Option<Answer> {
    let a = sluice_integration_tests::http_request(port, method, path, token, Some(body))?;
    Some(Answer { status: a.status, challenge: a.header("www-authenticate"), body: a.body })
}

/// `(METHOD, path, role)` of every operation of `docs/openapi.yaml`.
fn operations() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(repo_root().join("docs/openapi.yaml")).expect("docs/openapi.yaml");
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("docs/openapi.yaml is YAML");
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_mapping().expect("paths") {
        let path = path.as_str().expect("a path").to_string();
        for method in ["get", "put", "post", "delete", "patch", "head", "options"] {
            if let Some(op) = item.get(method) {
                let role = op["x-sluice-role"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{method} {path}: no x-sluice-role in docs/openapi.yaml"))
                    .to_string();
                ops.push((method.to_uppercase(), path.clone(), role));
            }
        }
    }
    assert!(ops.len() >= 16, "only {} operations in docs/openapi.yaml", ops.len());
    ops
}

/// What the role rule says (docs/operations.md, "Roles and tokens"): 0 = served (neither
/// 401 nor 403), else the status.
fn expected(role: &str, read_set: bool, admin_set: bool, token: Option<&str>) -> u16 {
    let (shown_read, shown_admin) = (read_set && token == Some(READ), admin_set && token == Some(ADMIN));
    match role {
        _ if !read_set && !admin_set => 0,
        "open" => 0,
        "read" if shown_read || shown_admin => 0,
        "read" => 401,
        "admin" if !admin_set || shown_read => 403,
        "admin" if shown_admin => 0,
        "admin" => 401,
        other => panic!("unknown role {other:?}"),
    }
}

/// Start a replica on 127.0.0.1 with these token variables; wait until it is ready.
fn start(env: &Env, name: &str, tokens: &[(&str, &str)]) -> (Replica, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut vars = vec![("SLUICE_HTTP", listen.as_str())];
    vars.extend_from_slice(tokens);
    let mut replica = env.spawn_replica(name, &vars);
    let deadline = Instant::now() + WAIT;
    while request(port, "GET", "/readyz", None, "").map(|a| a.status) != Some(200) {
        assert!(replica.child.try_wait().unwrap().is_none(), "replica exited:\n{}", replica.log_text());
        assert!(Instant::now() < deadline, "replica not ready:\n{}", replica.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    (replica, port)
}

/// Every documented operation with every kind of token, against one replica.
fn walk(port: u16, read_set: bool, admin_set: bool) -> usize {
    let mut checked = 0;
    for (method, path, role) in operations() {
        // An id nothing has; a body that is not JSON: a change that gets past its role
        // stops there, before it changes or produces anything.
        let uri = path.replace("{id}", "no-such-id");
        let body = if method == "POST" { "not json" } else { "" };
        for token in [None, Some("it-wrong-token"), Some(READ), Some(ADMIN)] {
            let got = request(port, &method, &uri, token, body).unwrap_or_else(|| panic!("{method} {uri}: no answer"));
            let want = expected(&role, read_set, admin_set, token);
            let what = format!("{method} {uri} ({role}) on a replica with read token {read_set}, admin token {admin_set}, showing {token:?}: {got:?}");
            match want {
                0 => assert!(got.status != 401 && got.status != 403 && got.status < 500, "{what}"),
                401 => {
                    assert_eq!((got.status, got.challenge.as_deref()), (401, Some("Bearer")), "{what}");
                    assert_eq!(got.body["error"], "unauthorized", "{what}");
                }
                _ => {
                    assert_eq!((got.status, &got.body["error"]), (403, &Value::from("forbidden")), "{what}");
                    assert!(got.body["message"].as_str().unwrap_or_default().contains("http.admin_token"), "{what}");
                }
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn every_documented_route_answers_each_token_as_its_role_says() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("http-roles");
    env.run(&["init", "--partitions", "1"]);

    let (mut both, port) = start(&env, "both", &[("SLUICE_READ_TOKEN", READ), ("SLUICE_ADMIN_TOKEN", ADMIN)]);
    assert!(walk(port, true, true) >= 64);
    // Data behind the credential: a record posted with the admin token is read back with
    // the read token, and never without it.
    let posted = request(
        port,
        "POST",
        "/api/v1/collections/roles-c/records",
        Some(ADMIN),
        r#"{"id": "r1", "operation": "upsert", "document": "secret text"}"#,
    )
    .expect("an answer");
    assert_eq!(posted.status, 202, "{posted:?}");
    let deadline = Instant::now() + WAIT;
    loop {
        let read = request(port, "GET", "/api/v1/collections/roles-c/records", Some(READ), "").expect("an answer");
        if read.status == 200 && read.body["records"][0]["document"] == "secret text" {
            break;
        }
        assert!(Instant::now() < deadline, "the record never showed: {read:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let anonymous = request(port, "GET", "/api/v1/collections/roles-c/records", None, "").expect("an answer");
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert!(!anonymous.body.to_string().contains("secret text"), "{anonymous:?}");
    assert_eq!(both.terminate(Duration::from_secs(30)), Some(0), "{}", both.log_text());

    // Only a read token: reads take it, and no token may change anything.
    let (mut read_only, port) = start(&env, "read-only", &[("SLUICE_READ_TOKEN", READ)]);
    assert!(walk(port, true, false) >= 64);
    read_only.wait_for_log("changes are refused (http.admin_token unset)", Duration::from_secs(5));
    assert_eq!(read_only.terminate(Duration::from_secs(30)), Some(0), "{}", read_only.log_text());
}

#[test]
fn a_replica_on_all_interfaces_without_a_token_refuses_to_start_unless_told_to() {
    let env = Env::sqlite("http-exposed");
    // No token: exit code 2 before anything starts (no broker needed), naming the setting,
    // the address and the fixes.
    for listen in [format!("0.0.0.0:{}", free_port()), format!("[::]:{}", free_port())] {
        let mut refused = env.spawn_replica_with("refused", &["--http", &listen], &[]);
        let status = refused.wait_exit(Duration::from_secs(30)).expect("the replica exits by itself");
        let log = refused.log_text();
        assert_eq!(status.code(), Some(2), "{listen}: {log}");
        for needle in [
            format!("http.listen = {listen:?}"),
            "neither http.read_token nor http.admin_token is set".to_string(),
            "SLUICE_READ_TOKEN".to_string(),
            "SLUICE_ADMIN_TOKEN".to_string(),
            "http.allow_unauthenticated = true".to_string(),
        ] {
            assert!(log.contains(&needle), "{listen}: {needle:?} missing from:\n{log}");
        }
    }

    if !require_kafka() {
        return;
    }
    env.run(&["init", "--partitions", "1"]);
    // On purpose: it starts, says so in its log, and serves without a token.
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let mut open =
        env.spawn_replica_with("allowed", &["--http", &listen], &[("SLUICE_HTTP__ALLOW_UNAUTHENTICATED", "true")]);
    let up = |replica: &mut Replica, port: u16| {
        let deadline = Instant::now() + WAIT;
        while request(port, "GET", "/healthz", None, "").map(|a| a.status) != Some(200) {
            assert!(replica.child.try_wait().unwrap().is_none(), "replica exited:\n{}", replica.log_text());
            assert!(Instant::now() < deadline, "replica never answered:\n{}", replica.log_text());
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    up(&mut open, port);
    open.wait_for_log("serving every record without a credential", Duration::from_secs(5));
    assert_eq!(request(port, "GET", "/api/v1/collections", None, "").expect("an answer").status, 200);
    assert_eq!(open.terminate(Duration::from_secs(30)), Some(0), "{}", open.log_text());

    // With a token on all interfaces: it starts, and the data needs the token.
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let mut guarded = env.spawn_replica_with("guarded", &["--http", &listen], &[("SLUICE_ADMIN_TOKEN", ADMIN)]);
    up(&mut guarded, port);
    assert_eq!(request(port, "GET", "/api/v1/collections", None, "").expect("an answer").status, 401);
    assert_eq!(request(port, "GET", "/api/v1/collections", Some(ADMIN), "").expect("an answer").status, 200);
    assert!(!guarded.log_text().contains("without a credential"), "{}", guarded.log_text());
    assert_eq!(guarded.terminate(Duration::from_secs(30)), Some(0), "{}", guarded.log_text());
}
