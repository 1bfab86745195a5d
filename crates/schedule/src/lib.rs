//! Schedule evaluation for chronoshard: cron expressions in IANA time zones (with the DST rules
//! stated below), fixed intervals, and one-shot instants.
//!
//! This crate owns "when does this schedule fire next". It is pure: no I/O, no clock reads, no
//! global state. Every instant is passed in by the caller and every answer is a UTC instant.
//! All `next_after`-style methods are strictly after their argument, so iterating them yields
//! strictly increasing fire times with no duplicates.
//!
//! Modules: `field` parses one cron field, `days` says which days the Quartz day tokens select
//! in a month, `search` finds the next matching wall-clock time, `cron` maps wall-clock times
//! to instants under the DST rules, `interval` does `every`, `spec` compiles the wire's
//! `ScheduleSpec` (and checks a whole `JobSpec`) into a `Schedule`.
//!
//! # Resolved ambiguities
//!
//! Where cron dialects differ these choices were made (each is covered by a test; docs/api.md
//! "Schedules" states them for users):
//!
//! - **Day-of-month / day-of-week OR rule.** A day field counts as restricted unless its text
//!   starts with `*` or `?`, exactly as Vixie cron and cronie decide it. So `0 0 13 * FRI` fires
//!   on every 13th and every Friday, while `0 0 */2 * MON` fires on odd days that are Mondays
//!   (AND), and `0 0 1-31 * MON` fires every day (OR with a full day-of-month).
//! - **"Hour field is a single value"** (selects the DST rule) is syntactic: one number with no
//!   `*`, `,`, `-` or `/`. `2-2` and `2/24` are ranges/steps, so their gap times are skipped.
//! - **Day-of-week steps** run over 0–6: `*/2` = Sun,Tue,Thu,Sat; `5/2` = Fri; `7/2` = Sun only
//!   (7 is the end of the week already). Explicit ranges run as written, 7 folding onto Sunday:
//!   `5-7` = Fri,Sat,Sun. `SUN` at the end of a range means 7, so `FRI-SUN` works.
//! - **`?`** is accepted only as the whole day-of-month or day-of-week field and means `*`.
//! - **Steps larger than the range** are accepted (`*/90` in minutes is minute 0), as in Vixie.
//! - **Quartz day tokens.** Day-of-month accepts `L` (the last day), `L-n` (n days before it,
//!   n = 0–30), `nW` (the weekday nearest to day n, n = 1–31), `LW` and `L-nW` (the weekday
//!   nearest to `L` or `L-n`). Nearest is Quartz's rule: a Saturday moves to the Friday before,
//!   a Sunday to the Monday after, but never out of the month: Saturday the 1st moves to Monday
//!   the 3rd, a Sunday that is the last day to the Friday two days before. Day-of-week accepts
//!   `wL` (the last weekday w of the month) and `w#k` (its k-th, k = 1–5), w a number 0–7 or a
//!   name: `5L`, `FRIL`, `5#2`, `FRI#2`. Letters are case-insensitive, as names are.
//! - **A token's day must exist in the month**, or the token selects nothing that month, as a
//!   plain `31` does in April: `31W` in April, `L-30` in February, `5#5` in a month with four
//!   Fridays. No token moves a fire into another month.
//! - **Day-of-week numbers are this crate's, not Quartz's**: 0–7 with Sunday as 0 or 7 (Vixie
//!   cron, Spring), so `5L` is the last Friday and `6#1` the first Saturday, where Quartz
//!   (1 = Sunday) would read the last Thursday and the first Friday. Names read the same in
//!   both. `L` alone in day-of-week is refused: Quartz reads it as Saturday, Spring refuses it.
//! - **Lists of tokens are unions**, mixed freely with plain items: `L,15`, `1W,LW`,
//!   `1#1,3#3`, `MON,5L` (Quartz refuses the last two). A token is a whole list item: ranges and
//!   steps of tokens (`1-5W`, `L/2`, `1-5L`) are refused.
//! - **OR rule with tokens.** A field holding a token does not start with `*` or `?`, so it is
//!   restricted: `0 0 L * 5#2` fires on the last day and on the second Friday, `0 0 LW * *` on
//!   the last weekday only. (Quartz refuses two restricted day fields; Vixie's rule applies.)
//!   Tokens only choose days, so the DST rules, which depend on the hour field, are unchanged.
//! - **Macros** `@yearly` = `@annually` = `0 0 1 1 *`, `@monthly` = `0 0 1 * *`, `@weekly` =
//!   `0 0 * * 0`, `@daily` = `@midnight` = `0 0 * * *`, `@hourly` = `0 * * * *` (Vixie's
//!   meanings), case-insensitive, and alone: no other field may follow. A macro is exactly its
//!   expansion, DST rules included: `@daily` has the single hour 0, so a midnight that falls in
//!   a gap fires at the gap end; `@hourly` has a wildcard hour and skips missing hours.
//!   `@reboot` and other names are refused.
//! - **A year field** (Quartz's optional seventh) is refused, naming [`CronField::Year`].
//! - **Errors name their field**: [`Error::InvalidCron`] carries the [`CronField`] at fault and
//!   its message starts with the field's name; the field is `None` only for a wrong number of
//!   fields or an unknown macro, which concern the whole expression.
//! - **Whole seconds.** Cron fire times are whole seconds; a sub-second `after` is handled
//!   (`next_after(10:00:00.5)` can return 10:00:01).
//! - **Gap end collisions.** In zones with a 30-minute shift (Australia/Lord_Howe) the gap end can
//!   itself be a matching time (`0,30 2 * * *`: 02:00 is skipped, its fire lands on 02:30); it
//!   fires once.
//! - **Never-firing expressions** whose day rule can never match (`0 0 30 2 *`, `0 0 30W 2 *`,
//!   `0 0 */20 * 1#2`) are recognised at parse time and return `None` at once: which days match
//!   depends only on a month's length and the weekday of its 1st, and every such combination
//!   is tried. Anything else is searched at most 400 years ahead, which covers every Feb 29 +
//!   weekday combination (up to 40 years apart).
//! - **Time zones**: `""` and `"UTC"` are UTC; any other name must be an IANA name (case
//!   sensitive, legacy links like `US/Eastern` accepted) from the tz data compiled into
//!   chrono-tz. That data lists transitions through 2099; later, a zone's last offset applies.
//! - **Overlap start.** When `after` falls inside the first pass of an overlap, a non-single-hour
//!   schedule's next fire may be the *second* pass of an earlier local time (NY, `0 * * * *`,
//!   after 05:15Z = 01:15 EDT → 06:00Z = 01:00 EST): fires are ordered by instant, not by
//!   local time.
//! - **Representable range.** Cron searches start no earlier than two days after chrono's
//!   minimum instant and give up a year before its maximum; nothing panics at the extremes.
//! - **`every`**: `end_at` is exclusive; `next_after(start_at)` does not return `start_at` itself,
//!   use [`Schedule::first_at_or_after`] to get the k = 0 fire. A `Schedule::Every` built
//!   directly with a zero interval (bypassing [`Schedule::every`]) fires once at `start_at`.
//! - **`At`** in the past: `next_after` and `first_at_or_after` both return `None` for it;
//!   "due at once" is the caller's decision, not this crate's.

mod cron;
mod days;
mod field;
mod interval;
mod search;
pub mod spec;

pub use chrono::{DateTime, Utc};
pub use cron::Cron;

/// A field of a cron expression, as [`Error::InvalidCron`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CronField {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
    /// A seventh field, Quartz's optional year: always refused.
    Year,
}

impl CronField {
    /// The name messages use: `second`, `minute`, `hour`, `day-of-month`, `month`,
    /// `day-of-week`, `year`.
    pub fn name(self) -> &'static str {
        match self {
            CronField::Second => "second",
            CronField::Minute => "minute",
            CronField::Hour => "hour",
            CronField::DayOfMonth => "day-of-month",
            CronField::Month => "month",
            CronField::DayOfWeek => "day-of-week",
            CronField::Year => "year",
        }
    }
}

impl std::fmt::Display for CronField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a schedule could not be built. Messages are meant for API users (400 responses).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The expression is invalid. `field` is the field at fault, and the message starts with its
    /// name (`hour: value 24 out of range 0-23`); it is `None` only when the expression as a
    /// whole is wrong: a field count other than 5, 6 or 7 (7 is refused as a year field), or
    /// an unknown macro.
    #[error("invalid cron expression: {}", cron_message(*.field, .reason))]
    InvalidCron {
        field: Option<CronField>,
        reason: String,
    },
    #[error("unknown time zone {0:?}")]
    UnknownTimeZone(String),
    #[error("invalid interval: {0}")]
    InvalidInterval(String),
}

fn cron_message(field: Option<CronField>, reason: &str) -> String {
    match field {
        Some(field) => format!("{field}: {reason}"),
        None => reason.to_owned(),
    }
}

/// When a job fires.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    Cron(Cron),
    /// Fires at `start_at + k·every` (k = 0, 1, …) while strictly before `end_at`.
    /// Build it with [`Schedule::every`], which checks the invariants.
    Every {
        every: std::time::Duration,
        start_at: DateTime<Utc>,
        end_at: Option<DateTime<Utc>>,
    },
    /// Fires once, at this instant.
    At(DateTime<Utc>),
}

impl Schedule {
    /// An interval schedule; `every` must be positive (sub-second is fine) and `end_at`, if
    /// given, later than `start_at`.
    pub fn every(
        every: std::time::Duration,
        start_at: DateTime<Utc>,
        end_at: Option<DateTime<Utc>>,
    ) -> Result<Schedule, Error> {
        if every.is_zero() {
            return Err(Error::InvalidInterval(
                "every must be greater than zero".into(),
            ));
        }
        if let Some(end) = end_at {
            if end <= start_at {
                return Err(Error::InvalidInterval(format!(
                    "end_at {} must be after start_at {}",
                    end.to_rfc3339(),
                    start_at.to_rfc3339()
                )));
            }
        }
        Ok(Schedule::Every {
            every,
            start_at,
            end_at,
        })
    }

    /// The first fire time strictly after `after`, or `None` when there is none.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Schedule::Cron(cron) => cron.next_after(after),
            Schedule::Every {
                every,
                start_at,
                end_at,
            } => interval::next_after(*every, *start_at, *end_at, after),
            Schedule::At(t) => (*t > after).then_some(*t),
        }
    }

    /// The first fire time at or after `t` (e.g. `every`'s k = 0 fire when `t == start_at`).
    /// An `At` in the past still returns `None`: treating it as due is the caller's policy.
    pub fn first_at_or_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Instants have nanosecond resolution, so "at or after t" is "strictly after t - 1ns".
        // Only `t` = the earliest representable instant has no predecessor; nothing real
        // fires there, so falling back to "strictly after" is harmless.
        match t.checked_sub_signed(chrono::TimeDelta::nanoseconds(1)) {
            Some(before) => self.next_after(before),
            None => self.next_after(t),
        }
    }

    /// Up to `count` fire times strictly after `after`, strictly increasing.
    pub fn preview(&self, after: DateTime<Utc>, count: usize) -> Vec<DateTime<Utc>> {
        // The API caps count at 1000; don't let a huge count reserve memory up front.
        let mut out = Vec::with_capacity(count.min(1024));
        let mut cursor = after;
        while out.len() < count {
            match self.next_after(cursor) {
                Some(t) => {
                    out.push(t);
                    cursor = t;
                }
                None => break,
            }
        }
        out
    }
}
