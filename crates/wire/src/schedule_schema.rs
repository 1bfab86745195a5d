//! The OpenAPI schema of `ScheduleSpec`, written out because the type's fields cannot say it:
//! exactly one of four shapes, each with only its own fields. (The struct holds all the fields as
//! options so that one validation can name the field at fault; a derived schema would allow
//! any mix of them, and generated clients and fuzzers would believe it.)

use utoipa::openapi::{
    schema::{AdditionalProperties, KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type},
    RefOr, Schema,
};

use crate::{job::ScheduleSpec, Dur};

fn text(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
}

fn instant(description: &str) -> ObjectBuilder {
    text(description).format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
}

fn shape(title: &str, fields: Vec<(&str, RefOr<Schema>)>, required: &str) -> ObjectBuilder {
    let mut o = ObjectBuilder::new()
        .schema_type(Type::Object)
        .title(Some(title))
        .required(required)
        .additional_properties(Some(AdditionalProperties::FreeForm(false)));
    for (name, schema) in fields {
        o = o.property(name, schema);
    }
    o
}

impl utoipa::PartialSchema for ScheduleSpec {
    fn schema() -> RefOr<Schema> {
        let dur = <Dur as utoipa::PartialSchema>::schema;
        let cron = text("5 fields (minute hour day-of-month month day-of-week), 6 with leading seconds, or a macro such as `@daily`.")
            .min_length(Some(1))
            .max_length(Some(256));
        let zone =
            text("IANA time zone of the cron expression, default `UTC`.").min_length(Some(1));
        OneOfBuilder::new()
            .description(Some(
                "When a job fires: exactly one of `cron` (with an optional `timezone`), `every` \
                 (with optional `start_at`, `end_at`), `at` or `delay`.",
            ))
            .item(shape(
                "CronSchedule",
                vec![("cron", cron.into()), ("timezone", zone.into())],
                "cron",
            ))
            .item(shape(
                "EverySchedule",
                vec![
                    ("every", dur()),
                    (
                        "start_at",
                        instant("First fire; default: when the schedule is set.").into(),
                    ),
                    (
                        "end_at",
                        instant("Fires only strictly before this instant.").into(),
                    ),
                ],
                "every",
            ))
            .item(shape(
                "AtSchedule",
                vec![(
                    "at",
                    instant("One-shot at this instant; in the past: due at once.").into(),
                )],
                "at",
            ))
            .item(shape("DelaySchedule", vec![("delay", dur())], "delay"))
            .into()
    }
}

impl utoipa::ToSchema for ScheduleSpec {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example the schema's shapes describe parses, and each shape refuses the fields of
    /// the others.
    #[test]
    fn the_shapes_are_the_ones_serde_reads() {
        let schema =
            serde_json::to_value(<ScheduleSpec as utoipa::PartialSchema>::schema()).unwrap();
        let shapes = schema["oneOf"].as_array().unwrap();
        let required: Vec<&str> = shapes
            .iter()
            .map(|s| s["required"][0].as_str().unwrap())
            .collect();
        assert_eq!(required, ["cron", "every", "at", "delay"]);
        for s in shapes {
            assert_eq!(s["additionalProperties"], false, "{s}");
        }
        for json in [
            r#"{"cron": "0 3 * * *", "timezone": "Europe/Berlin"}"#,
            r#"{"every": "30s", "start_at": "2026-01-01T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"}"#,
            r#"{"at": "2026-01-01T00:00:00Z"}"#,
            r#"{"delay": "5m"}"#,
        ] {
            let spec: ScheduleSpec = serde_json::from_str(json).unwrap();
            spec.kind().unwrap();
        }
    }
}
