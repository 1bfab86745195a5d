"""Drives chronoshard through a client generated from openapi/openapi.json by
openapi-python-client, the way another team's service would: create a job, pause, resume and
trigger it, read its runs and the ticket of the triggered run. Prints what it saw as one JSON
object; any answer other than the documented one fails with a message.

Usage: python3 use_client.py BASE_URL TOKEN (the generated package `chronoshard_client` on the
path).
"""

import json
import sys

from chronoshard_client import AuthenticatedClient
from chronoshard_client.api.jobs import (
    create_job,
    get_job,
    get_ticket,
    list_runs,
    pause_job,
    resume_job,
    trigger_job,
)
from chronoshard_client.models import (
    CronSchedule,
    Job,
    JobSpec,
    Problem,
    QueueTarget,
    RunPage,
    RunView,
    TicketView,
)
from chronoshard_client.models.queue_target_type import QueueTargetType


def expect(response, status, model):
    if response.status_code != status or not isinstance(response.parsed, model):
        sys.exit(f"expected {status} {model.__name__}, got {response.status_code}: {response.content!r}")
    return response.parsed


def main(base_url, token):
    client = AuthenticatedClient(base_url=base_url, token=token, raise_on_unexpected_status=True)
    spec = JobSpec(
        tenant="generated",
        name="nightly",
        schedule=CronSchedule(cron="0 3 * * *", timezone="Europe/Berlin"),
        target=QueueTarget(queue="generated-q", type_=QueueTargetType.QUEUE),
    )
    job = expect(create_job.sync_detailed(client=client, body=spec, idempotency_key="gen-1"), 201, Job)
    again = expect(create_job.sync_detailed(client=client, body=spec, idempotency_key="gen-1"), 200, Job)
    assert again.id == job.id, (again.id, job.id)
    paused = expect(pause_job.sync_detailed(job.id, client=client), 200, Job)
    resumed = expect(resume_job.sync_detailed(job.id, client=client), 200, Job)
    run = expect(trigger_job.sync_detailed(job.id, client=client), 202, RunView)
    runs = expect(list_runs.sync_detailed(job.id, client=client, limit=10), 200, RunPage)
    ticket_id = run.ticket_ids[0]
    ticket = expect(get_ticket.sync_detailed(ticket_id, client=client), 200, TicketView)
    missing = get_job.sync_detailed(ticket_id, client=client)
    problem = missing.parsed
    if missing.status_code != 404 or not isinstance(problem, Problem):
        sys.exit(f"expected a 404 problem, got {missing.status_code}: {missing.content!r}")
    print(json.dumps({
        "job": str(job.id),
        "states": [paused.state.value, resumed.state.value],
        "triggered": run.status.value,
        "runs": [r.status.value for r in runs.runs],
        "ticket": str(ticket.ticket_id),
        "ticket_job": str(ticket.job_id),
        "not_found_code": problem.code,
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
