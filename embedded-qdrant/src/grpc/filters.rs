//! gRPC filters (`qdrant.Filter`) in the engine's terms: each protobuf condition is
//! written in the REST API's JSON form and read by the engine's own REST deserializer, so
//! a filter means the same over both APIs and is validated by one parser. A condition the
//! server cannot evaluate is refused with its name, never dropped (an unfiltered answer to
//! a filtered query would be silently wrong).

use qdrant_client::qdrant::{self as pb, condition::ConditionOneOf, r#match::MatchValue};
use serde_json::{json, Map, Value};
use tonic::Status;

/// The engine's filter for a gRPC one.
pub fn to_engine(filter: &pb::Filter) -> Result<qdrant_edge::Filter, Status> {
    let value = filter_json(filter)?;
    serde_json::from_value(value)
        .map_err(|e| Status::invalid_argument(format!("Wrong input: bad filter: {e}")))
}

/// An optional gRPC filter, as the engine's.
pub fn optional(filter: &Option<pb::Filter>) -> Result<Option<qdrant_edge::Filter>, Status> {
    filter.as_ref().map(to_engine).transpose()
}

fn filter_json(f: &pb::Filter) -> Result<Value, Status> {
    let mut out = Map::new();
    for (name, list) in [
        ("must", &f.must),
        ("should", &f.should),
        ("must_not", &f.must_not),
    ] {
        if !list.is_empty() {
            out.insert(name.to_owned(), conditions_json(list)?);
        }
    }
    if let Some(min) = &f.min_should {
        out.insert(
            "min_should".to_owned(),
            json!({"conditions": conditions_json(&min.conditions)?, "min_count": min.min_count}),
        );
    }
    Ok(Value::Object(out))
}

fn conditions_json(list: &[pb::Condition]) -> Result<Value, Status> {
    list.iter()
        .map(condition_json)
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

fn unsupported(what: &str) -> Status {
    Status::unimplemented(format!(
        "filter condition {what} is not implemented by embedded-qdrant"
    ))
}

fn condition_json(c: &pb::Condition) -> Result<Value, Status> {
    match &c.condition_one_of {
        Some(ConditionOneOf::Field(f)) => field_json(f),
        Some(ConditionOneOf::IsEmpty(e)) => Ok(json!({"is_empty": {"key": e.key}})),
        Some(ConditionOneOf::IsNull(n)) => Ok(json!({"is_null": {"key": n.key}})),
        Some(ConditionOneOf::HasId(h)) => {
            let ids = h
                .has_id
                .iter()
                .map(|id| crate::convert::point_id(Some(id)).map(|p| crate::convert::id_json(&p)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(json!({"has_id": ids}))
        }
        Some(ConditionOneOf::Filter(f)) => filter_json(f),
        Some(ConditionOneOf::Nested(n)) => {
            let inner = n
                .filter
                .as_ref()
                .ok_or_else(|| Status::invalid_argument("nested condition without a filter"))?;
            Ok(json!({"nested": {"key": n.key, "filter": filter_json(inner)?}}))
        }
        Some(ConditionOneOf::HasVector(v)) => Ok(json!({"has_vector": v.has_vector})),
        Some(ConditionOneOf::Slice(_)) => Err(unsupported("slice")),
        None => Err(Status::invalid_argument("empty filter condition")),
    }
}

fn range_json<T: serde::Serialize>(
    lt: Option<T>,
    gt: Option<T>,
    gte: Option<T>,
    lte: Option<T>,
) -> Value {
    json!({"lt": lt, "gt": gt, "gte": gte, "lte": lte})
}

fn field_json(f: &pb::FieldCondition) -> Result<Value, Status> {
    let mut out = Map::new();
    out.insert("key".to_owned(), json!(f.key));
    if let Some(m) = &f.r#match {
        let m = match &m.match_value {
            Some(MatchValue::Keyword(k)) => json!({"value": k}),
            Some(MatchValue::Integer(i)) => json!({"value": i}),
            Some(MatchValue::Boolean(b)) => json!({"value": b}),
            Some(MatchValue::Text(t)) => json!({"text": t}),
            Some(MatchValue::Phrase(t)) => json!({"phrase": t}),
            Some(MatchValue::TextAny(t)) => json!({"text_any": t}),
            Some(MatchValue::Keywords(k)) => json!({"any": k.strings}),
            Some(MatchValue::Integers(i)) => json!({"any": i.integers}),
            Some(MatchValue::ExceptKeywords(k)) => json!({"except": k.strings}),
            Some(MatchValue::ExceptIntegers(i)) => json!({"except": i.integers}),
            Some(MatchValue::Prefix(_)) => return Err(unsupported("match.prefix")),
            Some(MatchValue::Substring(_)) => return Err(unsupported("match.substring")),
            None => return Err(Status::invalid_argument("match without a value")),
        };
        out.insert("match".to_owned(), m);
    }
    if let Some(r) = &f.range {
        out.insert("range".to_owned(), range_json(r.lt, r.gt, r.gte, r.lte));
    }
    if let Some(r) = &f.datetime_range {
        let ts = |t: &Option<prost_types::Timestamp>| t.as_ref().map(rfc3339);
        out.insert(
            "range".to_owned(),
            range_json(ts(&r.lt), ts(&r.gt), ts(&r.gte), ts(&r.lte)),
        );
    }
    if let Some(v) = &f.values_count {
        out.insert(
            "values_count".to_owned(),
            range_json(v.lt, v.gt, v.gte, v.lte),
        );
    }
    if f.geo_bounding_box.is_some() || f.geo_radius.is_some() || f.geo_polygon.is_some() {
        return Err(unsupported("geo"));
    }
    // is_empty / is_null inside a field condition are Qdrant's newer spelling of the
    // IsEmpty / IsNull conditions.
    match (f.is_empty, f.is_null) {
        (Some(true), _) => return Ok(json!({"is_empty": {"key": f.key}})),
        (_, Some(true)) => return Ok(json!({"is_null": {"key": f.key}})),
        _ => {}
    }
    if out.len() == 1 {
        return Err(Status::invalid_argument(format!(
            "field condition on {:?} has nothing to match",
            f.key
        )));
    }
    Ok(Value::Object(out))
}

fn rfc3339(t: &prost_types::Timestamp) -> String {
    let secs = t.seconds;
    let nanos = t.nanos.clamp(0, 999_999_999) as u32;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm):
/// written out here rather than pulling a date crate for one conversion.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_convert() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn a_keyword_filter_reads_as_the_rest_one() {
        let f = pb::Filter {
            must: vec![pb::Condition {
                condition_one_of: Some(ConditionOneOf::Field(pb::FieldCondition {
                    key: "city".into(),
                    r#match: Some(pb::Match {
                        match_value: Some(MatchValue::Keyword("Berlin".into())),
                    }),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        let engine = to_engine(&f).unwrap();
        let rest: qdrant_edge::Filter = serde_json::from_value(
            json!({"must": [{"key": "city", "match": {"value": "Berlin"}}]}),
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&engine).unwrap(),
            serde_json::to_value(&rest).unwrap()
        );
    }
}
