//! Workflows built from the input as a structure: steps of every type, routing and references
//! among their ids, expressions from parts that mean something. Mostly valid, so that the
//! engine runs them far; now and then not, where a mistake is worth making.

use arbitrary::Unstructured;
use serde_json::{Map, Value, json};

/// A workflow document of one to seven top-level steps, `s0`, `s1`, ..., in that order.
pub(super) fn arbitrary_workflow(u: &mut Unstructured) -> arbitrary::Result<Value> {
    let count = u.int_in_range(1..=7)?;
    let ids: Vec<String> = (0..count).map(|i| format!("s{i}")).collect();
    let mut steps = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        steps.push(arbitrary_step(u, id, &ids, &ids[..i], 0)?);
    }
    let mut document = json!({"steps": steps});
    if u.ratio(1, 3)? {
        document["max_visits"] = json!(small(u, 1..=6)?);
    }
    Ok(document)
}

/// True once in `times`, and never once `u` has run out of data (where `ratio` is always true).
fn rarely(u: &mut Unstructured, times: u32) -> arbitrary::Result<bool> {
    Ok(!u.ratio(times - 1, times)?)
}

/// A number in `range`, and now and then 0, which no count in a workflow may be.
fn small(u: &mut Unstructured, range: std::ops::RangeInclusive<u32>) -> arbitrary::Result<u32> {
    if rarely(u, 40)? {
        Ok(0)
    } else {
        u.int_in_range(range)
    }
}

/// Where a step being drawn stands: its id, the ids it may route to, the `earlier` ones whose
/// data it may read, and how deep in parallel steps it is (0: a top-level step).
struct Place<'a> {
    id: &'a str,
    ids: &'a [String],
    earlier: &'a [String],
    depth: usize,
}

impl Place<'_> {
    fn is_branch(&self) -> bool {
        self.depth > 0
    }

    /// One of `from`, and now and then (or when there is none) a branch's id, which no step
    /// may name.
    fn pick(&self, u: &mut Unstructured, from: &[String]) -> arbitrary::Result<String> {
        Ok(if from.is_empty() || rarely(u, 40)? {
            format!("{}b0", self.id)
        } else {
            u.choose(from)?.clone()
        })
    }

    /// A step to route to.
    fn reference(&self, u: &mut Unstructured) -> arbitrary::Result<String> {
        self.pick(u, self.ids)
    }

    /// A step whose data to read.
    fn source(&self, u: &mut Unstructured) -> arbitrary::Result<String> {
        self.pick(u, self.earlier)
    }
}

/// One step of [`arbitrary_workflow`]: mostly valid, so that runs go far, and now and then
/// not (a reference to a branch, a branch that routes). It routes to any of `ids` and reads
/// the data of the `earlier` ones (the entry step is an agent: it has nothing to read).
fn arbitrary_step(
    u: &mut Unstructured,
    id: &str,
    ids: &[String],
    earlier: &[String],
    depth: usize,
) -> arbitrary::Result<Value> {
    let place = Place {
        id,
        ids,
        earlier,
        depth,
    };
    let branch = place.is_branch();
    let mut step = Map::new();
    step.insert("id".into(), json!(id));
    let kind = match u.choose_index(6)? {
        _ if earlier.is_empty() && !branch => 0,
        2 if branch && !rarely(u, 20)? => 0,
        4 | 5 if depth >= 2 => 0,
        kind => kind,
    };
    match kind {
        0 => agent_fields(u, &place, &mut step)?,
        1 => transform_fields(u, &place, &mut step)?,
        2 => condition_fields(u, &place, &mut step)?,
        3 => approval_fields(u, &place, &mut step)?,
        5 => map_fields(u, &place, &mut step)?,
        _ => parallel_fields(u, &place, &mut step)?,
    }
    if !branch || rarely(u, 20)? {
        routing_fields(u, &place, &mut step)?;
    }
    Ok(Value::Object(step))
}

type Fields = Map<String, Value>;

fn agent_fields(u: &mut Unstructured, place: &Place, step: &mut Fields) -> arbitrary::Result<()> {
    step.insert("type".into(), json!("agent"));
    step.insert("agent".into(), json!(*u.choose(&["a", "b", "c"])?));
    if !place.earlier.is_empty() && u.ratio(1, 4)? {
        step.insert("input".into(), json!(place.source(u)?));
    }
    if u.ratio(1, 4)? {
        step.insert(
            "retry".into(),
            json!({"max_attempts": small(u, 1..=4)?, "initial_interval_ms": 10}),
        );
    }
    if u.ratio(1, 5)? {
        step.insert("timeout_ms".into(), json!(small(u, 1..=60_000)?));
    }
    Ok(())
}

fn transform_fields(
    u: &mut Unstructured,
    place: &Place,
    step: &mut Fields,
) -> arbitrary::Result<()> {
    step.insert("type".into(), json!("transform"));
    let source = place.source(u)?;
    // Rarely jq: compiling a program costs some 3 ms in a debug build (the `jq` target
    // is where programs are fuzzed).
    let transform = match u.choose_index(10)? {
        _ if rarely(u, 30)? => format!("jq: .context[\"{source}\"]"),
        1 => "input.task".to_owned(),
        2..=4 => format!("context[\"{source}\"].files[0]"),
        _ => format!("context.{source}"),
    };
    step.insert("transform".into(), json!(transform));
    Ok(())
}

fn condition_fields(
    u: &mut Unstructured,
    place: &Place,
    step: &mut Fields,
) -> arbitrary::Result<()> {
    step.insert("type".into(), json!("condition"));
    step.insert(
        "condition".into(),
        json!(arbitrary_condition(u, place.earlier, 2)?),
    );
    for field in ["then", "else"] {
        if u.ratio(2, 3)? {
            step.insert(field.into(), json!(place.reference(u)?));
        }
    }
    Ok(())
}

fn approval_fields(
    u: &mut Unstructured,
    place: &Place,
    step: &mut Fields,
) -> arbitrary::Result<()> {
    step.insert("type".into(), json!("approval"));
    step.insert("message".into(), json!("ship it?"));
    for field in ["on_approve", "on_reject"] {
        if (!place.is_branch() || rarely(u, 60)?) && u.ratio(1, 2)? {
            step.insert(field.into(), json!(place.reference(u)?));
        }
    }
    if u.ratio(1, 4)? {
        step.insert("timeout_ms".into(), json!(small(u, 1..=60_000)?));
    }
    Ok(())
}

fn map_fields(u: &mut Unstructured, place: &Place, step: &mut Fields) -> arbitrary::Result<()> {
    step.insert("type".into(), json!("map"));
    let items = match u.choose_index(4)? {
        0 => "input.flags".to_owned(),
        1 => "input.task".to_owned(),
        2 => format!("context[\"{}\"].files", place.source(u)?),
        _ => "input.items".to_owned(),
    };
    step.insert("items".into(), json!(items));
    if u.ratio(1, 2)? {
        step.insert("max_concurrency".into(), json!(small(u, 1..=3)?));
    }
    if u.ratio(1, 3)? {
        let tolerated = if u.arbitrary()? {
            json!(u.int_in_range(0..=2)?)
        } else {
            json!(format!("{}%", u.int_in_range(0..=60)?))
        };
        step.insert("tolerated_failures".into(), tolerated);
    }
    if u.ratio(1, 2)? {
        step.insert("agent".into(), json!(*u.choose(&["a", "b", "c"])?));
        return Ok(());
    }
    // A chain: an agent, then a condition on the item that goes to another agent or to a
    // transform of the item.
    let chain = |n: usize| format!("{}c{n}", place.id);
    let mut first = json!({"id": chain(0), "type": "agent", "agent": "a"});
    if u.ratio(1, 4)? {
        first["on_error"] = json!(chain(3));
    }
    step.insert(
        "steps".into(),
        json!([
            first,
            {"id": chain(1), "type": "condition",
             "condition": format!("map.index < {} && context.{}", u.int_in_range(0..=4)?, chain(0)),
             "then": chain(2), "else": chain(3)},
            {"id": chain(2), "type": "agent", "agent": "b", "end": true},
            {"id": chain(3), "type": "transform", "transform": "map.item"}
        ]),
    );
    Ok(())
}

fn parallel_fields(
    u: &mut Unstructured,
    place: &Place,
    step: &mut Fields,
) -> arbitrary::Result<()> {
    step.insert("type".into(), json!("parallel"));
    let branches: Vec<String> = (0..u.int_in_range(1..=3)?)
        .map(|b| format!("{}b{b}", place.id))
        .collect();
    let mut built = Vec::new();
    for branch in &branches {
        built.push(arbitrary_step(
            u,
            branch,
            place.ids,
            place.earlier,
            place.depth + 1,
        )?);
    }
    step.insert("steps".into(), Value::Array(built));
    Ok(())
}

/// Where a step goes next and what bounds it: a top-level step's (a branch's, now and then,
/// which validation refuses).
fn routing_fields(u: &mut Unstructured, place: &Place, step: &mut Fields) -> arbitrary::Result<()> {
    if u.ratio(1, 3)? {
        step.insert("next".into(), json!(place.reference(u)?));
    } else if u.ratio(1, 8)? {
        step.insert("end".into(), json!(true));
    }
    if u.ratio(1, 4)? {
        step.insert("on_error".into(), json!(place.reference(u)?));
    }
    if u.ratio(1, 5)? {
        step.insert("max_visits".into(), json!(small(u, 1..=5)?));
    }
    if u.ratio(1, 10)? {
        step.insert("output".into(), json!(format!("{}_out", place.id)));
    }
    Ok(())
}

fn arbitrary_condition(
    u: &mut Unstructured,
    ids: &[String],
    depth: u32,
) -> arbitrary::Result<String> {
    if depth > 0 && u.ratio(1, 3)? {
        let left = arbitrary_condition(u, ids, depth - 1)?;
        let right = arbitrary_condition(u, ids, depth - 1)?;
        let op = *u.choose(&["&&", "||"])?;
        return Ok(if u.arbitrary()? {
            format!("!({left}) {op} {right}")
        } else {
            format!("({left}) {op} {right}")
        });
    }
    let Ok(id) = u.choose(ids) else {
        return Ok("input.n >= 3".to_owned());
    };
    Ok(match u.choose_index(5)? {
        0 => format!("context.{id}.success === true"),
        1 => format!("context.{id}.score > {}", u.int_in_range(0..=5)?),
        2 => format!("context.{id}"),
        3 => "input.n >= 3".to_owned(),
        _ => format!("context[\"{id}\"].approved == false"),
    })
}
