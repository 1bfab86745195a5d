//! The `workflows` verbs: create one from a JSON or TOML file, list, show, pause, resume,
//! trigger and delete them, and read and retry their runs. Each is one call of the REST API's
//! `/v1/workflows` and `/v1/workflow-runs` routes, printed by `output`.

use clap::{Args, Subcommand};
use reqwest::Method;

use super::{
    commands::TenantPage,
    jobs::read_body,
    output::{self, next_page_hint, print, Format},
    ApiArgs, ClientError,
};

#[derive(Args, Debug)]
pub struct Workflows {
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// Create a workflow from a JSON or TOML file (the body of `POST /v1/workflows`).
    Create {
        /// The workflow's body (`-` reads stdin).
        #[arg(long, short = 'f')]
        file: String,
        /// Sent as the `Idempotency-Key` header: repeating the create returns the first one.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List workflows, oldest first, a page at a time.
    List(TenantPage),
    /// Show a workflow and its steps.
    Get(Id),
    /// Pause a workflow: no run starts until it is resumed.
    Pause(Id),
    /// Resume a paused workflow from its next run time after now.
    Resume(Id),
    /// Start a run now, outside the schedule.
    Trigger(Id),
    /// Delete a workflow: no run starts any more; its runs stay readable.
    Delete(Id),
    /// A workflow's runs, newest first, with each step's state.
    Runs {
        /// The workflow's id.
        id: String,
        /// Runs per page, 1-500 (the API's default: 50).
        #[arg(long)]
        limit: Option<u32>,
        /// Only runs scheduled before this instant, RFC 3339 (printed after a full page).
        #[arg(long, value_name = "RFC3339")]
        before: Option<String>,
    },
    /// One run: every step's state, attempts, ticket id and times.
    Run(RunId),
    /// Retry a run that ended with a failed step, from that step, under the same run.
    Retry(RunId),
}

#[derive(Args, Debug)]
struct Id {
    /// The workflow's id.
    id: String,
}

#[derive(Args, Debug)]
struct RunId {
    /// The run's id (`run_id`).
    run_id: String,
}

/// Runs one `workflows` verb.
pub async fn run(w: Workflows) -> Result<(), ClientError> {
    let (api, format) = (&w.api, w.api.output);
    let client = api.client()?;
    match w.verb {
        Verb::Create {
            file,
            idempotency_key,
        } => {
            let body = read_body(&file)?;
            let reply = client
                .call(
                    Method::POST,
                    &["v1", "workflows"],
                    &[],
                    Some(&body),
                    idempotency_key.as_deref(),
                )
                .await?;
            if reply.status == 200 && format == Format::Table {
                eprintln!("an earlier create with this idempotency key created this workflow");
            }
            print(format, &reply.body, output::workflow)
        }
        Verb::List(page) => page.show(api, "workflows", output::workflows).await,
        Verb::Get(w) => print(
            format,
            &client.get(&["v1", "workflows", &w.id], &[]).await?,
            output::workflow,
        ),
        Verb::Pause(w) => {
            let reply = client.post(&["v1", "workflows", &w.id, "pause"]).await?;
            print(format, &reply.body, output::workflow)
        }
        Verb::Resume(w) => {
            let reply = client.post(&["v1", "workflows", &w.id, "resume"]).await?;
            print(format, &reply.body, output::workflow)
        }
        Verb::Trigger(w) => {
            let run = client.post(&["v1", "workflows", &w.id, "trigger"]).await?;
            print(format, &run.body, output::run)
        }
        Verb::Delete(w) => {
            client
                .call(Method::DELETE, &["v1", "workflows", &w.id], &[], None, None)
                .await?;
            match format {
                Format::Table => output::write(&format!("deleted workflow {}\n", w.id)),
                Format::Json => Ok(()),
            }
        }
        Verb::Runs { id, limit, before } => {
            let query = [("before", before), ("limit", limit.map(|n| n.to_string()))];
            let page = client
                .get(&["v1", "workflows", &id, "runs"], &query)
                .await?;
            print(format, &page, output::workflow_runs)?;
            next_page_hint(format, &page, "next_before", "--before");
            Ok(())
        }
        Verb::Run(r) => print(
            format,
            &client.get(&["v1", "workflow-runs", &r.run_id], &[]).await?,
            output::workflow_run,
        ),
        Verb::Retry(r) => {
            let run = client
                .post(&["v1", "workflow-runs", &r.run_id, "retry"])
                .await?;
            print(format, &run.body, output::workflow_run)
        }
    }
}
