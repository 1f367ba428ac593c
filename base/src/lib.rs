//! Sluice's foundations, imported by every layer above and importing none of them: the
//! offset convention and position algebra (`positions`), the one retry policy (`retry`),
//! fail points for crash tests (`failpoint`), a rate limit for log lines that can repeat
//! per record (`ratelimit`), secrets kept out of what is shown (`redact`), read tokens
//! (`token`). The main crate
//! re-exports each module under its own name (`sluice::positions`, ...).

pub mod failpoint;
pub mod positions;
pub mod ratelimit;
pub mod redact;
pub mod retry;
pub mod token;
