//! Identities: a run, a step, an agent, a worker. Each is its own type, so that a run id is never
//! passed where a step id is wanted, and each is an `Arc<str>`, so that a clone shares the text
//! instead of copying it (an id is cloned into every task, lease, event and watcher it names).
//!
//! They read as `&str` (`Deref`), are looked up in maps by `&str` (`Borrow<str>`), and are
//! strings on the wire, in Redis and in JSON (`#[serde(transparent)]`): only Rust sees the type.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};

/// Declares an identity type: a shared, immutable string with the conversions every id has.
macro_rules! identity {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                Self(Arc::from(text))
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                Self(Arc::from(text))
            }
        }

        impl From<&String> for $name {
            fn from(text: &String) -> Self {
                Self(Arc::from(text.as_str()))
            }
        }

        impl From<Arc<str>> for $name {
            fn from(text: Arc<str>) -> Self {
                Self(text)
            }
        }

        impl From<&$name> for $name {
            fn from(id: &$name) -> Self {
                id.clone()
            }
        }

        impl From<$name> for Arc<str> {
            fn from(id: $name) -> Self {
                id.0
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> Self {
                id.0.as_ref().to_owned()
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                *self.0 == **other
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == &*other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == &*other.0
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                **self == *other.0
            }
        }
    };
}

identity!(
    /// A run's id (a UUIDv7 the coordinator gives it, or the client's).
    RunId
);
identity!(
    /// A step's id, as the workflow names it.
    StepId
);
identity!(
    /// An agent's name: what a step asks for and a worker offers.
    AgentName
);
identity!(
    /// A worker's id, as it names itself in its hello.
    WorkerId
);

/// For `#[serde(deserialize_with)]` on an `Option` that older writers wrote as an empty string
/// for "none": both an absent field (with `#[serde(default)]`) and `""` read as `None`.
pub fn empty_as_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: From<String>,
{
    let text = Option::<String>::deserialize(deserializer)?;
    Ok(text.filter(|text| !text.is_empty()).map(T::from))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_clone_shares_the_text() {
        let run = RunId::from("run-1");
        let again = run.clone();
        assert!(std::ptr::eq(run.as_str(), again.as_str()));
    }

    #[test]
    fn an_id_is_a_plain_string_in_json() {
        let worker = WorkerId::from("w1");
        assert_eq!(serde_json::to_string(&worker).unwrap(), r#""w1""#);
        let back: WorkerId = serde_json::from_str(r#""w1""#).unwrap();
        assert_eq!(back, worker);
        assert_eq!(format!("{worker} {worker:?}"), r#"w1 "w1""#);
    }

    #[test]
    fn a_map_keyed_by_id_is_read_with_a_str() {
        let mut runs = HashMap::new();
        runs.insert(RunId::from("r"), 1);
        assert_eq!(runs.get("r"), Some(&1));
        let run = RunId::from("r");
        assert_eq!(run, "r");
        assert_eq!("r", run);
        assert_ne!(run, String::from("s"));
    }

    #[derive(Deserialize)]
    struct Entry {
        #[serde(default, deserialize_with = "empty_as_none")]
        worker_id: Option<WorkerId>,
    }

    #[test]
    fn an_empty_or_absent_string_reads_as_none() {
        let read = |json: &str| serde_json::from_str::<Entry>(json).unwrap().worker_id;
        assert_eq!(read(r#"{"worker_id":""}"#), None);
        assert_eq!(read("{}"), None);
        assert_eq!(read(r#"{"worker_id":"w"}"#), Some(WorkerId::from("w")));
    }
}
