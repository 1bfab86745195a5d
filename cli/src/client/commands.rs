//! The client verbs: their command line (clap derive) and one function per resource, each one
//! call of the REST API (paths and query parameters as in openapi/openapi.json) whose answer is
//! printed by `output`.
//!
//! Adding a resource: a variant of [`ClientCommand`] holding `ApiArgs` and a subcommand enum of
//! its verbs, a function here matching on the verb, and its table in `output`.

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::Value;

use super::{
    jobs::CreateArgs,
    output::{self, next_page_hint, print, Format},
    ApiArgs, ClientError,
};

/// The client verbs, beside the platform's roles in `chronoshard`'s subcommands.
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Jobs: create, list, get, pause, resume, trigger, delete.
    Jobs(Jobs),
    /// A job's runs (its occurrences), newest first; the next one shows as `scheduled`.
    Runs(Runs),
    /// Tickets: one run's execution, with its attempts.
    Tickets(Tickets),
    /// Dead letters (tickets whose attempts ran out): list, replay.
    Dlq(Dlq),
    /// The next fire times of a cron or interval schedule, as shards compute them.
    Preview(Preview),
    /// The shard map: each shard's owner and epoch, and shards being added (`--add N` adds
    /// N shards while jobs fire; the tenants whose place changes move to them).
    Shards(Shards),
    /// The shard nodes: status, shards, load, heartbeat.
    Nodes(Plain),
    /// The live workers: queues, tickets in flight, heartbeat.
    Workers(Plain),
    /// API tokens for one tenant or an admin: list, create (the token is shown once), revoke.
    Tokens(Tokens),
    /// Workflows (steps that wait for each other): create, list, get, pause, resume, trigger,
    /// delete; their runs, one run, and retrying a failed run.
    Workflows(super::workflows::Workflows),
}

#[derive(Args, Debug)]
pub struct Tokens {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    verb: TokensVerb,
}

#[derive(Subcommand, Debug)]
enum TokensVerb {
    /// List the tokens (never their secrets), oldest first.
    List {
        /// Only this tenant's tokens.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Create a token for one tenant (`--tenant`) or an admin (`--admin`); prints the token,
    /// which is shown this once.
    Create {
        /// The tenant whose jobs the token reaches.
        #[arg(long, required_unless_present = "admin", conflicts_with = "admin")]
        tenant: Option<String>,
        /// An admin token: every endpoint, every tenant.
        #[arg(long)]
        admin: bool,
        /// What the token is for, shown in the list.
        #[arg(long)]
        name: Option<String>,
        /// When the token stops working (RFC 3339).
        #[arg(long, value_name = "RFC3339")]
        expires_at: Option<String>,
    },
    /// Revoke a token by its id: it stops working on every control-plane replica.
    Revoke {
        /// The token's id (from `tokens list`), not the token itself.
        id: String,
    },
}

/// A verb with no arguments of its own.
#[derive(Args, Debug)]
pub struct Plain {
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(Args, Debug)]
pub struct Shards {
    #[command(flatten)]
    api: ApiArgs,
    /// Add this many shards (admin).
    #[arg(long, value_name = "N")]
    add: Option<u32>,
}

#[derive(Args, Debug)]
pub struct Jobs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    verb: JobsVerb,
}

#[derive(Subcommand, Debug)]
enum JobsVerb {
    /// Create a job from a JSON or TOML file (`--file`), flags, or both (flags override).
    Create(Box<CreateArgs>),
    /// List jobs, oldest first, a page at a time.
    List(TenantPage),
    /// Show a job.
    Get(JobId),
    /// Pause a job: no occurrences until it is resumed.
    Pause(JobId),
    /// Resume a paused job from its next occurrence after now.
    Resume(JobId),
    /// Fire a job now, outside its schedule.
    Trigger(JobId),
    /// Delete a job: future occurrences are cancelled; its history stays readable.
    Delete(JobId),
}

#[derive(Args, Debug)]
struct JobId {
    /// The job's id.
    id: String,
}

/// A page of a listing that can be limited to one tenant (jobs, workflows, dead letters).
#[derive(Args, Debug)]
pub(super) struct TenantPage {
    /// Only this tenant's.
    #[arg(long)]
    tenant: Option<String>,
    /// Items per page, 1-500 (the API's default: 50).
    #[arg(long)]
    limit: Option<u32>,
    /// The page after this cursor (printed after a full page, `next_cursor` in JSON).
    #[arg(long)]
    cursor: Option<String>,
}

impl TenantPage {
    /// `GET /v1/{resource}` of this page, printed, with the next page's hint.
    pub(super) async fn show(
        self,
        api: &ApiArgs,
        resource: &str,
        table: fn(&Value) -> String,
    ) -> Result<(), ClientError> {
        let query = [
            ("tenant", self.tenant),
            ("cursor", self.cursor),
            ("limit", self.limit.map(|n| n.to_string())),
        ];
        let page = api.client()?.get(&["v1", resource], &query).await?;
        print(api.output, &page, table)?;
        next_page_hint(api.output, &page, "next_cursor", "--cursor");
        Ok(())
    }
}

#[derive(Args, Debug)]
pub struct Runs {
    #[command(flatten)]
    api: ApiArgs,
    /// The job's id.
    job: String,
    /// Runs per page, 1-500 (the API's default: 50).
    #[arg(long)]
    limit: Option<u32>,
    /// Only runs scheduled before this instant, RFC 3339 (printed after a full page,
    /// `next_before` in JSON).
    #[arg(long, value_name = "RFC3339")]
    before: Option<String>,
}

#[derive(Args, Debug)]
pub struct Tickets {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    verb: TicketsVerb,
}

#[derive(Subcommand, Debug)]
enum TicketsVerb {
    /// Show a ticket: its job, queue, status, trace id and every attempt.
    Get(TicketId),
}

#[derive(Args, Debug)]
struct TicketId {
    /// The ticket's id.
    id: String,
}

#[derive(Args, Debug)]
pub struct Dlq {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    verb: DlqVerb,
}

#[derive(Subcommand, Debug)]
enum DlqVerb {
    /// List dead letters, newest first, a page at a time.
    List(TenantPage),
    /// Replay a dead letter: its next attempt runs now, with the job's retries afresh.
    Replay(TicketId),
}

#[derive(Args, Debug)]
pub struct Preview {
    #[command(flatten)]
    api: ApiArgs,
    /// Cron expression (5 or 6 fields).
    #[arg(long, value_name = "EXPR", required_unless_present = "every")]
    cron: Option<String>,
    /// IANA time zone of the cron expression (default UTC).
    #[arg(long, value_name = "ZONE", visible_alias = "timezone")]
    tz: Option<String>,
    /// Interval, such as `30s`.
    #[arg(long, value_name = "DURATION", conflicts_with = "cron")]
    every: Option<String>,
    /// Anchor of `--every` (default: `--after`).
    #[arg(long, value_name = "RFC3339")]
    start_at: Option<String>,
    /// `--every` fires only before this instant.
    #[arg(long, value_name = "RFC3339")]
    end_at: Option<String>,
    /// Fire times after this instant (default: now).
    #[arg(long, value_name = "RFC3339")]
    after: Option<String>,
    /// How many fire times, 1-1000 (the API's default: 10).
    #[arg(long)]
    count: Option<u32>,
}

/// Runs one verb.
pub async fn run(command: ClientCommand) -> Result<(), ClientError> {
    match command {
        ClientCommand::Jobs(j) => jobs(&j.api, j.verb).await,
        ClientCommand::Runs(r) => runs(r).await,
        ClientCommand::Tickets(t) => match t.verb {
            TicketsVerb::Get(id) => {
                let ticket = t.api.client()?.get(&["v1", "tickets", &id.id], &[]).await?;
                print(t.api.output, &ticket, output::ticket)
            }
        },
        ClientCommand::Dlq(d) => dlq(&d.api, d.verb).await,
        ClientCommand::Preview(p) => preview(p).await,
        ClientCommand::Shards(s) => match s.add {
            None => show(&s.api, "shards", output::shards).await,
            Some(add) => {
                let body = serde_json::json!({ "add": add });
                let map = (s.api.client()?)
                    .call(Method::POST, &["v1", "shards"], &[], Some(&body), None)
                    .await?;
                print(s.api.output, &map.body, output::shards)
            }
        },
        ClientCommand::Nodes(p) => show(&p.api, "nodes", output::nodes).await,
        ClientCommand::Workers(p) => show(&p.api, "workers", output::workers).await,
        ClientCommand::Tokens(t) => tokens(&t.api, t.verb).await,
        ClientCommand::Workflows(w) => super::workflows::run(w).await,
    }
}

async fn tokens(api: &ApiArgs, verb: TokensVerb) -> Result<(), ClientError> {
    let client = api.client()?;
    match verb {
        TokensVerb::List { tenant } => {
            let list = client.get(&["v1", "tokens"], &[("tenant", tenant)]).await?;
            print(api.output, &list, output::tokens)
        }
        TokensVerb::Create {
            tenant,
            admin,
            name,
            expires_at,
        } => {
            let mut body = serde_json::Map::new();
            if let Some(t) = tenant {
                body.insert("tenant".into(), t.into());
            }
            if admin {
                body.insert("admin".into(), true.into());
            }
            if let Some(n) = name {
                body.insert("name".into(), n.into());
            }
            if let Some(at) = expires_at {
                body.insert("expires_at".into(), at.into());
            }
            let body = Value::Object(body);
            let reply = client
                .call(Method::POST, &["v1", "tokens"], &[], Some(&body), None)
                .await?;
            print(api.output, &reply.body, output::created_token)
        }
        TokensVerb::Revoke { id } => {
            client
                .call(Method::DELETE, &["v1", "tokens", &id], &[], None, None)
                .await?;
            match api.output {
                Format::Table => output::write(&format!("revoked token {id}\n")),
                Format::Json => Ok(()),
            }
        }
    }
}

/// `GET /v1/{resource}`, printed.
async fn show(
    api: &ApiArgs,
    resource: &str,
    table: fn(&Value) -> String,
) -> Result<(), ClientError> {
    let value = api.client()?.get(&["v1", resource], &[]).await?;
    print(api.output, &value, table)
}

async fn jobs(api: &ApiArgs, verb: JobsVerb) -> Result<(), ClientError> {
    let client = api.client()?;
    let format = api.output;
    match verb {
        JobsVerb::Create(args) => {
            let body = args.body()?;
            let reply = client
                .call(
                    Method::POST,
                    &["v1", "jobs"],
                    &[],
                    Some(&body),
                    args.idempotency_key.as_deref(),
                )
                .await?;
            if reply.status == 200 && format == Format::Table {
                eprintln!("an earlier create with this idempotency key created this job");
            }
            print(format, &reply.body, output::job)
        }
        JobsVerb::List(page) => page.show(api, "jobs", output::jobs).await,
        JobsVerb::Get(j) => print(
            format,
            &client.get(&["v1", "jobs", &j.id], &[]).await?,
            output::job,
        ),
        JobsVerb::Pause(j) => {
            let job = client.post(&["v1", "jobs", &j.id, "pause"]).await?;
            print(format, &job.body, output::job)
        }
        JobsVerb::Resume(j) => {
            let job = client.post(&["v1", "jobs", &j.id, "resume"]).await?;
            print(format, &job.body, output::job)
        }
        JobsVerb::Trigger(j) => {
            let run = client.post(&["v1", "jobs", &j.id, "trigger"]).await?;
            print(format, &run.body, output::run)
        }
        JobsVerb::Delete(j) => {
            client
                .call(Method::DELETE, &["v1", "jobs", &j.id], &[], None, None)
                .await?;
            match format {
                Format::Table => output::write(&format!("deleted job {}\n", j.id)),
                // 204: the API answers no JSON, so there is none to print.
                Format::Json => Ok(()),
            }
        }
    }
}

async fn runs(r: Runs) -> Result<(), ClientError> {
    let query = [
        ("before", r.before),
        ("limit", r.limit.map(|n| n.to_string())),
    ];
    let page = r
        .api
        .client()?
        .get(&["v1", "jobs", &r.job, "runs"], &query)
        .await?;
    print(r.api.output, &page, output::runs)?;
    next_page_hint(r.api.output, &page, "next_before", "--before");
    Ok(())
}

async fn dlq(api: &ApiArgs, verb: DlqVerb) -> Result<(), ClientError> {
    let client = api.client()?;
    match verb {
        DlqVerb::List(page) => page.show(api, "dlq", output::dead_letters).await,
        DlqVerb::Replay(t) => {
            let ticket = client.post(&["v1", "dlq", &t.id, "replay"]).await?.body;
            print(api.output, &ticket, output::ticket)
        }
    }
}

async fn preview(p: Preview) -> Result<(), ClientError> {
    let query = [
        ("cron", p.cron),
        ("timezone", p.tz),
        ("every", p.every),
        ("start_at", p.start_at),
        ("end_at", p.end_at),
        ("after", p.after),
        ("count", p.count.map(|n| n.to_string())),
    ];
    let value = p
        .api
        .client()?
        .get(&["v1", "schedule", "preview"], &query)
        .await?;
    print(p.api.output, &value, output::preview)
}
