//! `sluice token merge`: one read token covering several; `sluice token latest`: a token
//! of the log topic's high watermarks now.

use anyhow::Result;
use serde_json::json;

use super::output;
use super::TokenCmd;
use crate::config::Config;
use crate::token::ReadToken;

pub async fn run(config: &Config, cmd: TokenCmd) -> Result<()> {
    let (token, format) = match cmd {
        TokenCmd::Merge { tokens, format } => (merge(&tokens)?, format),
        TokenCmd::Latest { partitions, format } => {
            let tokens = crate::reading::TokenSource::new(config.client_settings(), config.kafka.log_topic());
            let partitions = (!partitions.is_empty()).then_some(partitions);
            (tokens.latest(partitions).await?, format)
        }
    };
    let text = token.to_string();
    output::one(format.format, &json!({ "token": text }), || text.clone())
}

fn merge(tokens: &[String]) -> Result<ReadToken> {
    let mut merged: Option<ReadToken> = None;
    for t in tokens.iter().flat_map(|t| t.split(',')).filter(|t| !t.trim().is_empty()) {
        let t = ReadToken::parse(t)?;
        merged = Some(match merged {
            None => t,
            Some(m) => m.merge(&t)?,
        });
    }
    merged.ok_or_else(|| anyhow::anyhow!("no token given"))
}
