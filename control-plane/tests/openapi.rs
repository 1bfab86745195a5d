//! The committed OpenAPI document (openapi/openapi.json) is the one the code generates.
//! Regenerate with `UPDATE_OPENAPI=1 cargo test -p chronoshard-control-plane --test openapi`.

#[test]
fn committed_openapi_matches_the_code() {
    let generated =
        serde_json::to_string_pretty(&chronoshard_control_plane::api::document()).unwrap() + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi/openapi.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json is out of date: run UPDATE_OPENAPI=1 cargo test -p chronoshard-control-plane --test openapi"
    );
    // paths of the route table in docs/api.md, each of which must be documented
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    for p in [
        "/v1/jobs",
        "/v1/jobs/{id}",
        "/v1/jobs/{id}/runs",
        "/v1/tickets/{ticket_id}",
        "/v1/schedule/preview",
        "/v1/cluster",
        "/v1/settings",
        "/v1/nodes/{node_id}/drain",
        "/v1/nodes/{node_id}/undrain",
        "/v1/plugins",
        "/v1/strategy",
        "/readyz",
    ] {
        assert!(
            doc["paths"].get(p).is_some(),
            "{p} missing from the OpenAPI document"
        );
    }
    assert!(doc["components"]["schemas"].get("Problem").is_some());
}
