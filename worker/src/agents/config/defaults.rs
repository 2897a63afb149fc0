//! Defaults shared by the agents of one kind: a `[defaults.<kind>]` table (only `llm` takes
//! one) and the environment variables that set a field over it (`BATON_LLM_BASE_URL`...).
//!
//! Who wins, field by field: the agent's own table, then the environment variable, then
//! `[defaults.<kind>]`, then the kind's own default. Fields that stand for one another
//! (`prompt` and `prompt_file`) count as one: an agent that sets either inherits neither.
//! A defaults table is checked on its own, with the environment over it, whether or not an
//! agent inherits from it; a field an agent inherits is checked again with that agent, and
//! its error says where it came from.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

use toml::{Spanned, Value};

use super::{
    Checker, ConfigError, DEFAULTS, Env, Fields, Kind, Problem, Table, TableName, line_of,
};

/// What the agents of a kind may inherit.
pub(in crate::agents) struct KindDefaults {
    /// Environment variables, each with the field it sets for every agent of the kind whose
    /// table does not (over `[defaults.<kind>]`). Empty or blank is unset.
    pub(in crate::agents) env: &'static [(&'static str, &'static str)],
    /// Fields that stand for one another: an agent that sets one of them inherits none.
    pub(in crate::agents) alternatives: &'static [&'static [&'static str]],
    /// Checks a defaults table (with the environment over it) on its own: each field as it
    /// would be checked in an agent's table, no field required.
    pub(in crate::agents) check: fn(&Checker, Fields) -> Result<(), ConfigError>,
}

/// The `[defaults.<kind>]` tables of a file, checked, by kind.
pub(super) type Tables = BTreeMap<&'static str, Fields>;

impl KindDefaults {
    /// Sets in `fields` (an agent's table at `span`, of kind `kind`) what it does not set
    /// itself: the environment's fields, then `table`'s. Returns where each came from.
    pub(super) fn inherit(
        &self,
        fields: &mut Fields,
        kind: &str,
        table: Option<&Fields>,
        env: Env,
        span: Range<usize>,
    ) -> BTreeMap<String, String> {
        let own = self.taken(fields);
        let mut from = self.apply_env(fields, &own, env, span);
        for (field, value) in table.into_iter().flatten() {
            if !own.contains(field.as_str()) && !fields.contains_key(field) {
                fields.insert(field.clone(), value.clone());
                from.insert(field.clone(), format!("[defaults.{kind}]"));
            }
        }
        from
    }

    /// The fields `fields` sets, with their alternatives.
    fn taken(&self, fields: &Fields) -> BTreeSet<String> {
        let mut taken: BTreeSet<String> = fields.keys().cloned().collect();
        for group in self.alternatives {
            if group.iter().any(|field| fields.contains_key(*field)) {
                taken.extend(group.iter().map(|field| (*field).to_owned()));
            }
        }
        taken
    }

    /// Sets each field an environment variable gives, but those in `keep`, as a string at
    /// `span`; where each came from.
    fn apply_env(
        &self,
        fields: &mut Fields,
        keep: &BTreeSet<String>,
        env: Env,
        span: Range<usize>,
    ) -> BTreeMap<String, String> {
        let mut from = BTreeMap::new();
        for (variable, field) in self.env {
            if keep.contains(*field) {
                continue;
            }
            let Some(value) = env(variable).filter(|value| !value.trim().is_empty()) else {
                continue;
            };
            let value = Value::String(value.trim().to_owned());
            fields.insert((*field).to_owned(), Spanned::new(span.clone(), value));
            from.insert(
                (*field).to_owned(),
                format!("environment variable {variable}"),
            );
        }
        from
    }
}

/// Checks the `[defaults.<kind>]` tables of a file: each names a kind that takes defaults and
/// sets only fields of that kind, each valid (with the environment over it).
pub(super) fn check_tables<A>(
    tables: BTreeMap<String, Spanned<Table<DEFAULTS>>>,
    text: &str,
    base_dir: &Path,
    file: &Path,
    env: Env,
    kinds: &[Kind<A>],
) -> Result<Tables, ConfigError> {
    let mut checked = Tables::new();
    for (name, table) in tables {
        let span = table.span();
        let table_line = line_of(text, span.start);
        let Some((kind, spec)) = kinds
            .iter()
            .find_map(|kind| Some((kind, kind.defaults.as_ref()?)).filter(|_| kind.name == name))
        else {
            return Err(ConfigError::Toml {
                file: file.to_owned(),
                line: Some(table_line),
                message: format!(
                    "[defaults.{name}] is not a table of defaults Baton knows: {}",
                    takers(kinds)
                ),
            });
        };
        let mut checker = Checker {
            text,
            file,
            base_dir,
            env,
            table: TableName::Defaults(kind.name),
            table_line,
            inherited: BTreeMap::new(),
        };
        let fields = table.into_inner().0;
        if let Some(value) = fields.get("kind") {
            return Err(checker.error(
                "kind",
                Some(value.span()),
                Problem::Invalid(format!(
                    "cannot be set here: [defaults.{}] is for every agent of kind \"{}\"",
                    kind.name, kind.name
                )),
            ));
        }
        checker.reject_unknown(kinds, kind, &fields, false)?;
        let mut effective = fields.clone();
        checker.inherited = spec.apply_env(&mut effective, &BTreeSet::new(), env, span);
        (spec.check)(&checker, effective)?;
        checked.insert(kind.name, fields);
    }
    Ok(checked)
}

/// The kinds that take defaults, as a message names them.
fn takers<A>(kinds: &[Kind<A>]) -> String {
    let tables: Vec<String> = kinds
        .iter()
        .filter(|kind| kind.defaults.is_some())
        .map(|kind| format!("[defaults.{}]", kind.name))
        .collect();
    match tables.as_slice() {
        [] => "no kind of agent takes defaults".to_owned(),
        [one] => format!("only {one} is (the defaults of every agent of that kind)"),
        many => format!("the tables are {}", many.join(", ")),
    }
}
