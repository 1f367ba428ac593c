//! The group commit: every batch waiting for the one writer goes into one transaction,
//! each with its own compare-and-set and outcome (docs/design.md invariant 2).

use std::sync::Arc;

use rusqlite::{params, Connection, TransactionBehavior};

use super::positions::{read_next_offset, write_next_offset};
use super::store::{off_runtime, PendingCommit, SqliteSysdb, Writing, BACKEND};
use super::{attached, changelog, values};
use crate::sysdb::error::{Result, SysdbError};
use crate::sysdb::stored_fields::{encode_embedding, encode_metadata};
use crate::sysdb::types::{now_ms, AppendedChanges, BatchCommit, CommitReport};

/// Commit every waiting batch in ONE transaction (group commit; see
/// [`SqliteSysdb::commit_batch`]). Each batch keeps its own outcome: its compare-and-set
/// and its writes either all stay or are rolled back alone, so one batch's conflict or
/// refused value never touches another's. If the transaction itself cannot begin or
/// commit, every batch gets that error and nothing of any of them is stored.
pub(super) fn commit_group(conn: &mut Connection, w: Writing<'_>, group: Vec<PendingCommit>) {
    let outcomes = match commit_group_sync(conn, w, &group) {
        Ok(outcomes) => outcomes,
        Err(e) => group.iter().map(|_| Err(e.clone())).collect(),
    };
    for (pending, outcome) in group.into_iter().zip(outcomes) {
        // The caller may have stopped waiting (its worker was cancelled): nothing to tell.
        let _ = pending.reply.send(outcome);
    }
}

/// The group's batches first go in together, without savepoints: inside a savepoint,
/// SQLite copies every page before its first change to a sub-journal (a temporary file
/// beyond 64 KiB), a cost per batch that only a failing batch needs. If one of them
/// fails, nothing of that attempt stays and the group runs again, each batch in its own
/// savepoint ([`commit_each`]).
pub(super) fn commit_group_sync(
    conn: &mut Connection,
    w: Writing<'_>,
    group: &[PendingCommit],
) -> Result<Vec<Result<CommitReport>>> {
    if group.len() > 1 {
        if let Some(reports) = commit_all_or_none(conn, w, group)? {
            return Ok(reports.into_iter().map(Ok).collect());
        }
    }
    commit_each(conn, w, group)
}

/// A group's open write transaction: where its records go and what it changed.
pub(super) struct GroupTx<'c> {
    tx: rusqlite::Transaction<'c>,
    target: values::Target,
    acct: values::Account,
}

/// Begin a group's write transaction and choose where its records go. Dropping the
/// transaction without commit rolls back, so an early return stores nothing.
pub(super) fn begin_group<'c>(
    conn: &'c mut Connection,
    w: Writing<'_>,
    group: &[PendingCommit],
) -> Result<GroupTx<'c>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut acct = values::Account::default();
    let writes = group.iter().flat_map(|p| &p.batch.collections).flat_map(|c| &c.writes);
    let (count, row_bytes) = writes.fold((0usize, 0usize), |(n, b), (id, r)| {
        let value = r.as_ref().map_or(0, |r| {
            values::metadata_size(&r.metadata)
                + r.document.as_ref().map_or(0, String::len)
                + r.embedding.as_ref().map_or(0, |e| 4 * e.len())
        });
        (n + 1, b + id.len() + value)
    });
    // Large transactions, those whose rows would fill the delta at once, and those with
    // function outputs (whose writes read the output records first, in SQL) merge the
    // delta and write `records` directly.
    let target = if count >= values::DIRECT_WRITES
        || row_bytes as u64 >= w.tuning.delta_max_bytes
        || group.iter().any(|p| !p.batch.functions.is_empty())
    {
        w.merge(&tx, true, &mut acct)?;
        values::Target::Records
    } else {
        values::Target::Delta
    };
    Ok(GroupTx { tx, target, acct })
}

/// Merge the delta if it passed a bound, compact if `records` changed, and commit.
pub(super) fn finish_group(mut g: GroupTx<'_>, w: Writing<'_>) -> Result<()> {
    let records_changed = match g.target {
        values::Target::Records => true,
        // The values appended through the delta are compacted after its merge.
        values::Target::Delta => w.merge(&g.tx, false, &mut g.acct)?,
    };
    if records_changed {
        w.flush_and_compact(&g.tx, &mut g.acct)?;
    } else {
        g.acct.flush(&g.tx)?;
    }
    g.tx.commit()?;
    Ok(())
}

/// Every batch of the group in one transaction, or none: `None` when a batch failed
/// (the transaction is rolled back and nothing of the group is stored).
pub(super) fn commit_all_or_none(
    conn: &mut Connection,
    w: Writing<'_>,
    group: &[PendingCommit],
) -> Result<Option<Vec<CommitReport>>> {
    let mut g = begin_group(conn, w, group)?;
    let now = now_ms();
    let mut reports = Vec::with_capacity(group.len());
    for pending in group {
        match apply_batch(&g.tx, &pending.batch, now, &mut g.acct, g.target) {
            Ok(report) => reports.push(report),
            Err(_) => return Ok(None),
        }
    }
    finish_group(g, w)?;
    Ok(Some(reports))
}

/// Every batch of the group in its own savepoint, with its own outcome.
pub(super) fn commit_each(
    conn: &mut Connection,
    w: Writing<'_>,
    group: &[PendingCommit],
) -> Result<Vec<Result<CommitReport>>> {
    let mut g = begin_group(conn, w, group)?;
    let now = now_ms();
    let mut outcomes = Vec::with_capacity(group.len());
    for pending in group {
        if group.len() == 1 {
            outcomes.push(apply_batch(&g.tx, &pending.batch, now, &mut g.acct, g.target));
            continue;
        }
        g.tx.execute_batch("SAVEPOINT batch")?;
        // A batch rolled back to its savepoint takes its counts with it.
        let before = g.acct;
        let outcome = apply_batch(&g.tx, &pending.batch, now, &mut g.acct, g.target);
        if let Err(e) = &outcome {
            g.acct = before;
            // Some errors (disk full, I/O) end the whole transaction in SQLite: then the
            // savepoint is gone and nothing of the group is stored; every batch gets the
            // error that ended it.
            if g.tx.execute_batch("ROLLBACK TO batch").is_err() || g.tx.is_autocommit() {
                return Err(e.clone());
            }
        }
        g.tx.execute_batch("RELEASE batch")?;
        outcomes.push(outcome);
    }
    if outcomes.iter().any(Result::is_ok) {
        finish_group(g, w)?;
    }
    Ok(outcomes)
}

/// One batch's writes inside an open write transaction: the compare-and-set first (the
/// database's only write lock is held, so nothing can move the position in between).
/// What it changes in the value log's counts goes into `acct` (`sqlite/values.rs`).
pub(super) fn apply_batch(
    tx: &Connection,
    batch: &BatchCommit,
    now: i64,
    acct: &mut values::Account,
    target: values::Target,
) -> Result<CommitReport> {
    let stored = read_next_offset(tx, &batch.topic, batch.delta.partition)?;
    #[cfg(test)]
    let check = !crate::sysdb::types::skips_compare_and_set(&batch.topic);
    #[cfg(not(test))]
    let check = true;
    if check {
        batch.delta.check(stored)?;
    }
    {
        let mut upsert_collection = tx.prepare_cached(
            "INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (id) DO UPDATE SET
                 dimension = COALESCE(collections.dimension, excluded.dimension),
                 log_position = excluded.log_position,
                 record_count = collections.record_count + excluded.record_count",
        )?;
        let mut records = values::RecordWriter::with_target(tx, target)?;
        for c in &batch.collections {
            upsert_collection.execute(params![
                c.id,
                c.partition,
                c.dimension,
                c.log_position,
                c.record_count_delta,
                now
            ])?;
            for (id, write) in &c.writes {
                match write {
                    Some(r) => records.put_parts(
                        &c.id,
                        id,
                        r.embedding.as_ref().map(encode_embedding),
                        encode_metadata(&r.metadata),
                        r.document.as_deref(),
                        r.offset,
                        acct,
                    )?,
                    None => records.delete(&c.id, id, acct)?,
                }
            }
        }
    }
    // Attached functions: their status is read here, inside the write transaction.
    let report = if batch.changelog {
        // The change feed: the batch's record changes, then its outputs' changes.
        let mut outputs = Vec::new();
        let mut report = attached::commit_functions(tx, batch, now, acct, Some(&mut outputs))?;
        let first = changelog::append(tx, batch.delta.partition, &batch.changes, now)?;
        let after = changelog::append(tx, batch.delta.partition, &outputs, now)?;
        report.appended = first.or(after).map(|first_seq| AppendedChanges { first_seq, outputs });
        report
    } else {
        attached::commit_functions(tx, batch, now, acct, None)?
    };
    write_next_offset(tx, &batch.topic, batch.delta.partition, batch.delta.to, now)?;
    Ok(report)
}

impl SqliteSysdb {
    /// Commit a batch with its position (compare-and-set), grouped with whatever other
    /// batches wait at the same time: SQLite has one writer, so while one transaction
    /// commits, the batches of other partitions queue here, and the next transaction takes
    /// them all. Fewer, larger transactions write each rewritten page once for several
    /// partitions' records. Each batch keeps its own outcome (savepoints), so the crash
    /// and zombie guarantees are those of one transaction per batch.
    pub async fn commit_batch(&self, batch: Arc<BatchCommit>) -> Result<CommitReport> {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        self.inner.pending.lock().unwrap_or_else(|p| p.into_inner()).push(PendingCommit { batch, reply });
        let inner = Arc::clone(&self.inner);
        off_runtime(move || {
            let writer = inner.writer().and_then(|conn| Ok((conn, inner.turn()?)));
            let (mut conn, _turn) = match writer {
                Ok(held) => held,
                Err(e) => {
                    for pending in std::mem::take(&mut *inner.pending.lock().unwrap_or_else(|p| p.into_inner())) {
                        let _ = pending.reply.send(Err(e.clone()));
                    }
                    return;
                }
            };
            // Whoever holds the writer takes every waiting batch; ours may already have
            // been taken by the previous holder, which then answers it.
            let group = std::mem::take(&mut *inner.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if !group.is_empty() {
                tracing::debug!(batches = group.len(), "sqlite group commit");
                inner.stats.write_transaction();
                commit_group(&mut conn, Writing::of(&inner), group);
            }
        })
        .await?;
        outcome.await.map_err(|_| SysdbError::Database {
            backend: BACKEND,
            message: "the group commit holding this batch ended without an outcome (a panic on the writer thread)"
                .into(),
        })?
    }
}
