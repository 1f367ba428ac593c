//! The one output contract of every printing command: `--format table|json|jsonl`.
//!
//! * `table` (the default everywhere): a human table, columns aligned.
//! * `json`: exactly ONE JSON document on stdout (an array for lists, an object for a
//!   single answer).
//! * `jsonl`: one JSON object per line (a single answer is one line).
//!
//! Everything goes through [`Out`], whose writes return `io::Error` instead of panicking
//! like `println!`: a reader that closes the pipe early (`sluice ... | head -1`) surfaces
//! as a `BrokenPipe` error, which `main` turns into a quiet exit 0 ([`is_broken_pipe`]).

use std::io::Write;

use clap::{Args, ValueEnum};
use comfy_table::{presets, ContentArrangement, Table};
use serde::Serialize;

/// Output format of a printing command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    /// Aligned columns for people.
    #[default]
    Table,
    /// One JSON document.
    Json,
    /// One JSON object per line.
    Jsonl,
}

/// `--format`, flattened into every printing command.
#[derive(Debug, Clone, Copy, Args, Default)]
pub struct FormatArg {
    /// Output format: table (aligned columns), json (one JSON document) or jsonl (one
    /// JSON object per line).
    #[arg(long, value_enum, default_value_t = Format::Table, env = "SLUICE_FORMAT")]
    pub format: Format,
}

/// Buffered, locked stdout whose writes report a closed pipe as an error.
pub struct Out {
    w: std::io::BufWriter<std::io::StdoutLock<'static>>,
}

impl Default for Out {
    fn default() -> Self {
        Out::new()
    }
}

impl Out {
    pub fn new() -> Out {
        Out { w: std::io::BufWriter::new(std::io::stdout().lock()) }
    }

    /// One line of text.
    pub fn line(&mut self, text: impl std::fmt::Display) -> std::io::Result<()> {
        writeln!(self.w, "{text}")
    }

    /// One compact JSON value on one line.
    pub fn json_line<T: Serialize + ?Sized>(&mut self, value: &T) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.w, value).map_err(std::io::Error::from)?;
        self.w.write_all(b"\n")
    }

    /// One pretty JSON document.
    pub fn json_doc<T: Serialize + ?Sized>(&mut self, value: &T) -> std::io::Result<()> {
        serde_json::to_writer_pretty(&mut self.w, value).map_err(std::io::Error::from)?;
        self.w.write_all(b"\n")
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }

    /// Raw access for streaming writers.
    pub fn writer(&mut self) -> &mut impl Write {
        &mut self.w
    }
}

/// A table with the crate's plain preset: no borders, header separated by spacing only,
/// never wrapped (scripts cut columns with `awk`).
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING).set_content_arrangement(ContentArrangement::Disabled).set_header(header.to_vec());
    // Tight columns: one space between them (the preset pads each cell by one on both sides).
    for c in t.column_iter_mut() {
        c.set_padding((0, 1));
    }
    t
}

/// Print a list of rows: a table (built by `to_table`), a JSON array, or JSON lines.
pub fn rows<T: Serialize>(format: Format, rows: &[T], to_table: impl FnOnce(&[T]) -> Table) -> anyhow::Result<()> {
    listing(format, rows, |rows| to_table(rows).trim_fmt())
}

/// Print a list of rows whose human form is text already laid out (`text`), or a JSON
/// array, or JSON lines.
pub fn listing<T: Serialize>(format: Format, rows: &[T], text: impl FnOnce(&[T]) -> String) -> anyhow::Result<()> {
    let mut out = Out::new();
    match format {
        Format::Table => out.line(text(rows).trim_end())?,
        Format::Json => out.json_doc(rows)?,
        Format::Jsonl => {
            for r in rows {
                out.json_line(r)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// Print one answer: a line of text for people (`human`), or one JSON object (`json`
/// and `jsonl` alike, one line for jsonl).
pub fn one<T: Serialize>(format: Format, value: &T, human: impl FnOnce() -> String) -> anyhow::Result<()> {
    let mut out = Out::new();
    match format {
        Format::Table => out.line(human())?,
        Format::Json => out.json_doc(value)?,
        Format::Jsonl => out.json_line(value)?,
    }
    out.flush()?;
    Ok(())
}

/// Whether an error (anywhere in its chain) is a closed stdout pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_the_header_and_aligned_columns() {
        let mut t = table(&["A", "LONGER"]);
        t.add_row(vec!["xyz", "1"]);
        let text = t.trim_fmt();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("A   LONGER"), "{text:?}");
        assert!(lines[1].starts_with("xyz 1"), "{text:?}");
    }

    #[test]
    fn broken_pipe_is_found_through_context() {
        let e = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe)).context("printing");
        assert!(is_broken_pipe(&e));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
