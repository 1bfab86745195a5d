//! The outbox's bookkeeping: which written attempts JetStream acknowledged (and under which stream
//! sequence), which are still to publish, and which were published but never started, for the
//! lost-ticket sweep to check and send again.

use chronoshard_wire::Ticket;
use sqlx::Row;
use uuid::Uuid;

use super::{
    parse_uuid,
    sql::{rows_per_statement, Sql},
    views::ticket_from_json,
    Result, Store,
};

/// A ticket attempt to publish, with how often the lost-ticket sweep has sent it already.
#[derive(Clone, Debug, PartialEq)]
pub struct Outgoing {
    pub ticket: Ticket,
    pub resends: u32,
}

impl From<Ticket> for Outgoing {
    fn from(ticket: Ticket) -> Self {
        Outgoing { ticket, resends: 0 }
    }
}

/// A JetStream acknowledgement of one attempt's publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    pub ticket: Uuid,
    pub attempt: u32,
    /// The stream sequence the ticket is stored under.
    pub seq: u64,
}

/// An attempt JetStream acknowledged and no worker has reported starting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unstarted {
    pub ticket: Uuid,
    pub attempt: u32,
    pub published_at: i64,
    /// None for attempts published before sequences were recorded.
    pub seq: Option<u64>,
    pub resends: u32,
}

impl Store {
    /// Marks attempts as acknowledged by JetStream, with their stream sequences: one statement
    /// per chunk, since the dispatcher records acks while the shard loop waits for the same
    /// connection.
    pub async fn mark_published(&self, acked: &[Acked], now: i64) -> Result<()> {
        if acked.is_empty() {
            return Ok(());
        }
        let chunks = acked.chunks(rows_per_statement(3));
        if self.one_trip_available() {
            let mut trip = self.trip();
            for chunk in chunks {
                push_marks(&mut trip, chunk, now);
            }
            self.one_trip(trip).await?;
            return Ok(());
        }
        let mut tx = self.write().await?;
        for chunk in chunks {
            let mut sql = Sql::new(&tx);
            push_marks(&mut sql, chunk, now);
            let (text, args) = sql.build();
            sqlx::query_with(&text, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// How many ticket attempts may be published by `now` and are not acknowledged yet.
    pub async fn unpublished_count(&self, now: i64) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM attempts WHERE published_at IS NULL AND finished_at IS NULL \
             AND (not_before IS NULL OR not_before <= $1)",
        )
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        Ok(n as u64)
    }

    /// Ticket attempts written and not finished, per dispatch queue: waiting in the outbox or
    /// for their backoff, queued for a worker, or running (found by the `attempts_open` index,
    /// each joined to its ticket by primary key). Sorted by queue.
    pub async fn open_attempts_by_queue(&self) -> Result<Vec<(String, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT t.queue, COUNT(*) FROM attempts a JOIN tickets t ON t.id = a.ticket_id \
             WHERE a.finished_at IS NULL GROUP BY t.queue ORDER BY t.queue",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(q, n)| (q, n as u64)).collect())
    }

    /// Tickets whose current attempt was written before `before`, may be published by `now` (a
    /// retry waits for its backoff) and was never acknowledged by JetStream: the outbox to
    /// publish again after a crash or a failed publish.
    pub async fn unpublished(&self, before: i64, now: i64, limit: u32) -> Result<Vec<Outgoing>> {
        let rows = sqlx::query(
            "SELECT t.body, a.resends FROM attempts a JOIN tickets t ON t.id = a.ticket_id AND t.attempt = a.attempt \
             WHERE a.published_at IS NULL AND a.created_at < $1 AND a.finished_at IS NULL \
             AND (a.not_before IS NULL OR a.not_before <= $2) ORDER BY a.created_at LIMIT $3",
        )
        .bind(before)
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(outgoing_from_row).collect()
    }

    /// First attempts written ahead of their time and not due by `now`: (job, tenant, ticket,
    /// due time). A new owner of the shard must be able to withdraw them too.
    pub async fn fired_ahead(&self, now: i64) -> Result<Vec<(Uuid, String, Uuid, i64)>> {
        let rows = sqlx::query(
            "SELECT t.job_id, j.tenant, t.id, a.not_before FROM attempts a \
             JOIN tickets t ON t.id = a.ticket_id AND t.attempt = a.attempt \
             JOIN jobs j ON j.id = t.job_id \
             WHERE a.attempt = 1 AND a.published_at IS NULL AND a.finished_at IS NULL AND a.not_before > $1",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    parse_uuid(&r.try_get::<String, _>(0)?)?,
                    r.try_get(1)?,
                    parse_uuid(&r.try_get::<String, _>(2)?)?,
                    r.try_get(3)?,
                ))
            })
            .collect()
    }

    /// Attempts acknowledged by JetStream before `published_before` that no worker has reported
    /// starting and that have no result, oldest first, after `after` (publish time, ticket id).
    pub async fn unstarted(
        &self,
        after: Option<(i64, Uuid)>,
        published_before: i64,
        limit: u32,
    ) -> Result<Vec<Unstarted>> {
        let (after_at, after_id) =
            after.map_or((i64::MIN, String::new()), |(at, id)| (at, id.to_string()));
        let rows = sqlx::query(
            "SELECT ticket_id, attempt, published_at, publish_seq, resends FROM attempts \
             WHERE published_at IS NOT NULL AND started_at IS NULL AND finished_at IS NULL \
             AND published_at < $1 AND (published_at > $2 OR (published_at = $2 AND ticket_id > $3)) \
             ORDER BY published_at, ticket_id LIMIT $4",
        )
        .bind(published_before)
        .bind(after_at)
        .bind(after_id)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Unstarted {
                    ticket: parse_uuid(&r.try_get::<String, _>("ticket_id")?)?,
                    attempt: r.try_get::<i64, _>("attempt")? as u32,
                    published_at: r.try_get("published_at")?,
                    seq: r
                        .try_get::<Option<i64>, _>("publish_seq")?
                        .map(|s| s as u64),
                    resends: r.try_get::<i64, _>("resends")? as u32,
                })
            })
            .collect()
    }

    /// Puts an unstarted attempt back into the outbox (JetStream no longer holds it), counting
    /// the resend. Only if it is still published at `published_at`, unstarted and without a
    /// result: a start or result that arrived meanwhile wins. Returns what to publish.
    pub async fn resend(&self, u: &Unstarted) -> Result<Option<Outgoing>> {
        let mut tx = self.write().await?;
        let tid = u.ticket.to_string();
        let n = sqlx::query(
            "UPDATE attempts SET published_at = NULL, publish_seq = NULL, resends = resends + 1 \
             WHERE ticket_id = $1 AND attempt = $2 AND published_at = $3 \
             AND started_at IS NULL AND finished_at IS NULL",
        )
        .bind(&tid)
        .bind(u.attempt as i64)
        .bind(u.published_at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 0 {
            return Ok(None);
        }
        let row = sqlx::query(
            "SELECT t.body, a.resends FROM attempts a JOIN tickets t ON t.id = a.ticket_id AND t.attempt = a.attempt \
             WHERE a.ticket_id = $1 AND a.attempt = $2",
        )
        .bind(&tid)
        .bind(u.attempt as i64)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        row.as_ref().map(outgoing_from_row).transpose()
    }
}

fn outgoing_from_row(r: &sqlx::any::AnyRow) -> Result<Outgoing> {
    Ok(Outgoing {
        ticket: ticket_from_json(&r.try_get::<String, _>("body")?)?,
        resends: r.try_get::<i64, _>("resends")? as u32,
    })
}

/// The update that records acks.
fn push_marks(sql: &mut Sql<'_>, acked: &[Acked], now: i64) {
    // VALUES columns are `column1..3` on both backends.
    sql.statement()
        .push("UPDATE attempts SET published_at = ")
        .push_bind(now)
        .push(", publish_seq = v.column3 FROM (");
    sql.push_values(acked, |mut row, a| {
        row.push_bind(a.ticket.to_string())
            .push_bind(a.attempt as i64)
            .push_bind(a.seq as i64);
    });
    sql.push(
        ") AS v WHERE attempts.ticket_id = v.column1 AND attempts.attempt = v.column2 \
         AND attempts.published_at IS NULL",
    );
}
