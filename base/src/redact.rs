//! Secrets out of what is shown: URLs for logs, errors and `config show`.

/// A URL with its secrets replaced by `***`, for logs, errors and `config show`: the
/// userinfo password and every query parameter named like a secret (`password`,
/// `passwd`, `secret`, ...). Parsed with a real URL parser; text that does not parse as
/// a URL is returned whole only when it cannot hold a secret (no `@`, no `?`).
pub fn redact_url(raw: &str) -> String {
    fn secret_param(name: &str) -> bool {
        let n = name.to_ascii_lowercase();
        ["password", "passwd", "pwd", "secret", "token", "key"].iter().any(|s| n.contains(s))
    }
    match url::Url::parse(raw) {
        Ok(mut u) => {
            // Nothing secret: the text as given (the serializer would normalize it, e.g.
            // percent-encode a space in a SQLite path).
            if u.password().is_none() && !u.query_pairs().any(|(k, _)| secret_param(&k)) {
                return raw.to_string();
            }
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            if u.query().is_some() {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if secret_param(&k) { "***".to_string() } else { v.into_owned() };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            // `***` is kept readable (the serializer would percent-encode it).
            u.to_string().replace("%2A%2A%2A", "***")
        }
        Err(_) if !raw.contains('@') && !raw.contains('?') => raw.to_string(),
        Err(_) => "<unparsable URL, not shown>".to_string(),
    }
}

/// Whether a librdkafka option holds a secret (its value is never logged nor shown): any
/// key containing `password`, `secret` or `key` (over-redacting a key file's path is
/// harmless), and the OAUTHBEARER config.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password") || k.contains("secret") || k.contains("key") || k.contains("sasl.oauthbearer.config")
}

/// Options (librdkafka's `key = value` pairs) with secret values replaced by `***`.
pub fn redacted_options(
    map: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), if is_secret_key(k) { "***".to_string() } else { v.clone() })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact_url("postgres://u:secret@h:5/db"), "postgres://u:***@h:5/db");
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
        assert_eq!(redact_url("sqlite://sluice.db"), "sqlite://sluice.db");
        assert_eq!(redact_url("sqlite:///tmp/my db.db"), "sqlite:///tmp/my db.db");
        let q = redact_url("postgres://u@h/db?password=hunter2&sslmode=disable&PassWd=x&client_secret=y");
        assert_eq!(q, "postgres://u@h/db?password=***&sslmode=disable&PassWd=***&client_secret=***");
        let both = redact_url("postgresql://u:p%40ss@h:5432/db?application_name=a");
        assert!(!both.contains("p%40ss") && both.contains("u:***@h:5432"), "{both}");
        assert!(!redact_url("postgres://u:pw@[bad").contains("pw"));
    }
}
