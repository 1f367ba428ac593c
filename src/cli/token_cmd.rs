//! `sluice token merge`: one read token covering several.

use anyhow::Result;
use serde_json::json;

use super::output;
use super::TokenCmd;
use crate::token::ReadToken;

pub fn run(cmd: TokenCmd) -> Result<()> {
    let TokenCmd::Merge { tokens, format } = cmd;
    let mut merged: Option<ReadToken> = None;
    for t in tokens.iter().flat_map(|t| t.split(',')).filter(|t| !t.trim().is_empty()) {
        let t = ReadToken::parse(t)?;
        merged = Some(match merged {
            None => t,
            Some(m) => m.merge(&t)?,
        });
    }
    let merged = merged.ok_or_else(|| anyhow::anyhow!("no token given"))?;
    let text = merged.to_string();
    output::one(format.format, &json!({ "token": text }), || text.clone())
}
