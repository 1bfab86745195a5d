//! The OpenAPI document's parts that no single handler knows: every operation's error answers,
//! made from the error table (`error::kinds`) rather than written out per route, the
//! `Retry-After` header of a 429, and the links from a created job to the operations on it.
//! Handlers' annotations list their successes only.

use std::collections::BTreeMap;

use utoipa::openapi::{
    content::ContentBuilder,
    header::HeaderBuilder,
    link::LinkBuilder,
    path::{Operation, ParameterIn},
    schema::{ObjectBuilder, Type},
    OpenApi, Ref, RefOr, Response, ResponseBuilder,
};

use super::{
    auth,
    error::{kinds, Applies, Kind},
};

/// Adds to `api` what this module owns (see the module docs).
pub fn finish(mut api: OpenApi) -> OpenApi {
    for (path, item) in api.paths.paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            add_errors(path, op);
        }
    }
    link_created_job(&mut api);
    api
}

/// The document as JSON, as served at `/openapi.json` and committed as openapi/openapi.json.
/// utoipa 5 writes a link's fields in snake case (`operation_id`); OpenAPI spells them in camel
/// case, and tools that follow links (schemathesis) ignore a link without `operationId`.
pub fn json(api: &OpenApi) -> serde_json::Value {
    let mut doc = serde_json::to_value(api).expect("the OpenAPI document serialises");
    let responses = doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
        .filter_map(|op| op.get_mut("responses")?.as_object_mut())
        .flat_map(|r| r.values_mut());
    for response in responses {
        let links = response.get_mut("links").and_then(|l| l.as_object_mut());
        for link in links.into_iter().flat_map(|l| l.values_mut()) {
            let Some(link) = link.as_object_mut() else {
                continue;
            };
            for (snake, camel) in [
                ("operation_id", "operationId"),
                ("operation_ref", "operationRef"),
                ("request_body", "requestBody"),
            ] {
                if let Some(v) = link.remove(snake) {
                    link.insert(camel.to_string(), v);
                }
            }
        }
    }
    doc
}

/// What an operation reads, to decide which rows of the table apply to it.
struct Shape<'a> {
    path: &'a str,
    id: &'a str,
    body: bool,
    params: bool,
    path_param: bool,
    tenant_filter: bool,
}

impl Shape<'_> {
    fn can_give(&self, kind: &Kind) -> bool {
        match kind.applies {
            Applies::EveryV1 => true,
            Applies::WithInput => self.body || self.params,
            Applies::WithBody => self.body,
            Applies::WithIdOrTenant => self.path_param || self.tenant_filter,
            Applies::AdminOnlyAnd(ids) => {
                !auth::tenant_may_use(self.path) || ids.contains(&self.id)
            }
            Applies::Only(ids) => ids.contains(&self.id),
        }
    }
}

fn add_errors(path: &str, op: &mut Operation) {
    let params = op.parameters.as_deref().unwrap_or_default();
    let shape = Shape {
        path,
        id: op.operation_id.as_deref().unwrap_or_default(),
        body: op.request_body.is_some(),
        params: !params.is_empty(),
        path_param: params.iter().any(|p| p.parameter_in == ParameterIn::Path),
        tenant_filter: auth::tenant_may_use(path)
            && params
                .iter()
                .any(|p| p.parameter_in == ParameterIn::Query && p.name == "tenant"),
    };
    let mut by_status: BTreeMap<u16, Vec<&Kind>> = BTreeMap::new();
    for kind in kinds::ALL.iter().copied().filter(|k| shape.can_give(k)) {
        by_status
            .entry(kind.status.as_u16())
            .or_default()
            .push(kind);
    }
    for (status, rows) in by_status {
        op.responses
            .responses
            .insert(status.to_string(), RefOr::T(problem_response(&rows)));
    }
}

/// One status's answer: a problem document, its possible codes described.
fn problem_response(rows: &[&Kind]) -> Response {
    let description = rows
        .iter()
        .map(|k| format!("`{}`: {}", k.code, k.when))
        .collect::<Vec<_>>()
        .join("; ");
    let content = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("Problem")))
        .build();
    let mut r = ResponseBuilder::new()
        .description(description)
        .content("application/problem+json", content);
    if rows.iter().any(|k| k.status.as_u16() == 429) {
        let seconds = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1));
        r = r.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(seconds)
                .description(Some("seconds to wait before trying again"))
                .build(),
        );
    }
    r.build()
}

/// The operations on a job, reachable from a create's answer by its `id`.
const ON_A_JOB: &[(&str, &str)] = &[
    ("GetJob", "get_job"),
    ("PatchJob", "patch_job"),
    ("DeleteJob", "delete_job"),
    ("PauseJob", "pause_job"),
    ("ResumeJob", "resume_job"),
    ("TriggerJob", "trigger_job"),
    ("ListRuns", "list_runs"),
];

fn link_created_job(api: &mut OpenApi) {
    let Some(RefOr::T(created)) = api
        .paths
        .paths
        .get_mut("/v1/jobs")
        .and_then(|item| item.post.as_mut())
        .and_then(|op| op.responses.responses.get_mut("201"))
    else {
        return;
    };
    for (name, operation) in ON_A_JOB {
        let link = LinkBuilder::new()
            .operation_id(*operation)
            .parameter("id", "$response.body#/id")
            .description(format!("`{operation}` on the job just created"))
            .build();
        created.links.insert((*name).to_string(), RefOr::T(link));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operation<'a>(api: &'a OpenApi, path: &str, method: &str) -> &'a Operation {
        let item = &api.paths.paths[path];
        match method {
            "get" => item.get.as_ref(),
            "post" => item.post.as_ref(),
            "put" => item.put.as_ref(),
            "delete" => item.delete.as_ref(),
            _ => item.patch.as_ref(),
        }
        .unwrap_or_else(|| panic!("{method} {path}"))
    }

    fn statuses(op: &Operation) -> Vec<&str> {
        op.responses.responses.keys().map(String::as_str).collect()
    }

    /// Each operation gets the error answers its shape can give, from the table alone.
    #[test]
    fn errors_come_from_the_table_by_what_an_operation_reads() {
        let api = super::super::openapi();
        let create = operation(&api, "/v1/jobs", "post");
        assert_eq!(
            statuses(create),
            ["200", "201", "400", "401", "403", "413", "414", "422", "429", "500", "503"]
        );
        let list = operation(&api, "/v1/jobs", "get");
        assert_eq!(
            statuses(list),
            ["200", "400", "401", "404", "414", "500", "503"]
        );
        let pause = operation(&api, "/v1/jobs/{id}/pause", "post");
        assert_eq!(
            statuses(pause),
            ["200", "400", "401", "404", "409", "414", "500", "503"]
        );
        let nodes = operation(&api, "/v1/nodes", "get");
        assert_eq!(statuses(nodes), ["200", "401", "403", "414", "500", "503"]);
        let Some(RefOr::T(too_many)) = create.responses.responses.get("429") else {
            panic!("a 429")
        };
        assert!(too_many.headers.contains_key("Retry-After"));
        assert!(too_many.description.contains("`rate_limited`"));
        assert!(too_many.description.contains("`quota_exceeded`"));
        // Operational endpoints answer without the API's errors.
        let health = operation(&api, "/healthz", "get");
        assert!(!statuses(health).contains(&"401"));
    }

    #[test]
    fn a_created_job_links_to_the_operations_on_it() {
        let api = super::super::openapi();
        let Some(RefOr::T(created)) = operation(&api, "/v1/jobs", "post")
            .responses
            .responses
            .get("201")
        else {
            panic!("a 201")
        };
        for (name, operation_id) in ON_A_JOB {
            let link = &created.links[*name];
            let RefOr::T(link) = link else {
                panic!("{name}")
            };
            assert_eq!(link.operation_id, *operation_id);
            assert_eq!(link.parameters["id"], "$response.body#/id");
            let doc = json(&api);
            let written = &doc["paths"]["/v1/jobs"]["post"]["responses"]["201"]["links"][*name];
            assert_eq!(written["operationId"], *operation_id, "{written}");
            assert!(written.get("operation_id").is_none(), "{written}");
            // The operation it names exists.
            assert!(api.paths.paths.values().any(|item| [
                &item.get,
                &item.post,
                &item.patch,
                &item.delete
            ]
            .iter()
            .any(|op| op.as_ref().and_then(|o| o.operation_id.as_deref()) == Some(operation_id))));
        }
    }
}
