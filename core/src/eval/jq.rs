//! `jq:` transforms, run by the jaq interpreter (no process, no file system, no environment).
//!
//! The program sees the document `{"input": ..., "context": {...}}` and must produce exactly one
//! value. Only the pure core library is loaded: `env`, `$ENV`, `now`, `input`, `debug` and module
//! imports are not available, so a transform gives the same answer wherever and whenever it runs.

use std::fmt;
use std::sync::{Arc, OnceLock};

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data};
use jaq_json::Val;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::text::text_nesting_depth;

/// Native filters that read the environment, the clock or stdin, or write to stderr: a transform
/// must give the same answer on every coordinator, so they are left out.
const IMPURE: &[&str] = &[
    "env",
    "now",
    "input",
    "inputs",
    "localtime",
    "strflocaltime",
    "debug_empty",
    "stderr_empty",
];

/// `debug` and `stderr` stay usable (programs copied from elsewhere use them) but write nothing.
const SILENT_LOGGING: &str = "def debug_empty: empty; def stderr_empty: empty;";

type Filter = jaq_core::Filter<data::JustLut<Val>>;

/// A compiled jq program, cheap to clone and safe to share between threads.
#[derive(Clone)]
pub struct JqProgram {
    source: Arc<str>,
    filter: Arc<Filter>,
}

impl fmt::Debug for JqProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JqProgram").field(&self.source).finish()
    }
}

impl PartialEq for JqProgram {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// Stack for compiling a program: a base, and more per byte of source (see
/// [`JqProgram::compile`]); unoptimised code takes some four times the stack.
const COMPILE_STACK_BASE: usize = 1 << 20;
const COMPILE_STACK_PER_BYTE: usize = if cfg!(debug_assertions) {
    12 << 10
} else {
    4 << 10
};
/// Beyond this no more stack is given (a program of over 80 KiB of source).
const COMPILE_STACK_MAX: usize = 1 << 30;

impl JqProgram {
    /// Parses and compiles a program, reporting the first problem jaq finds.
    ///
    /// jaq's lexer, parser and compiler recurse once per level of the program's syntax tree, and
    /// a plain chain nests one level per operator (`.a | .a | ...`, `[1, 2, ...]`, `1 + 1 + ...`):
    /// some 200 levels overflowed a 2 MiB stack (a Tokio worker's) in a debug build and 800 in
    /// release, which aborts the whole process, a coordinator validating a submitted workflow
    /// included. So it runs on a thread of its own whose stack grows with the source: measured
    /// at under 11 KiB per byte in a debug build (16,383 nested `-`) and under 3 KiB in release.
    /// The stack is reserved, not touched: a short program costs a thread start. Where there
    /// is no room for it (a jq sandbox counts it against its memory budget), the program
    /// compiles on the calling thread, as it did before.
    pub fn compile(source: &str) -> Result<Self, String> {
        let stack = source
            .len()
            .saturating_mul(COMPILE_STACK_PER_BYTE)
            .saturating_add(COMPILE_STACK_BASE)
            .min(COMPILE_STACK_MAX);
        std::thread::scope(|scope| {
            let compiling = std::thread::Builder::new()
                .name("jq-compile".into())
                .stack_size(stack)
                .spawn_scoped(scope, || Self::compile_here(source));
            match compiling {
                Ok(compiling) => compiling
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => Self::compile_here(source),
            }
        })
    }

    /// [`JqProgram::compile`] on the calling thread's stack.
    fn compile_here(source: &str) -> Result<Self, String> {
        let silent = jaq_core::load::parse(SILENT_LOGGING, |p| p.defs())
            .expect("the logging stand-ins parse");
        let defs = jaq_core::defs()
            .chain(silent)
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs())
            .filter(|(name, _, _)| !IMPURE.contains(name));
        let arena = Arena::default();
        let loader = Loader::new(defs);
        let program = File {
            code: source,
            path: (),
        };
        let modules = loader
            .load(&arena, program)
            .map_err(|errors| describe_load_errors(source, errors))?;
        let filter = Compiler::default()
            .with_funs(funs)
            .compile(modules)
            .map_err(|errors| {
                let names: Vec<String> = errors
                    .into_iter()
                    .flat_map(|(_, undefined)| undefined)
                    .map(|(name, kind)| format!("undefined {} `{name}`", kind.as_str()))
                    .collect();
                format!("cannot compile jq program: {}", names.join(", "))
            })?;
        Ok(Self {
            source: source.into(),
            filter: Arc::new(filter),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the program on `document` and returns its single output, within the default
    /// [`JqOutputLimits`].
    pub fn run(&self, document: &Value) -> Result<Value, String> {
        let input = Val::deserialize(document).map_err(|e| format!("jq input: {e}"))?;
        let text = self.run_val(input, &JqOutputLimits::default())?;
        parse_output(&text)
    }

    /// Runs the program on a document given as JSON text and returns its single output as JSON
    /// text, checked against `limits`: what a sandbox process does for a coordinator.
    pub fn run_json(&self, document: &[u8], limits: &JqOutputLimits) -> Result<String, String> {
        let mut reader = serde_json::Deserializer::from_slice(document);
        let input = Val::deserialize(&mut reader).map_err(|e| format!("jq input: {e}"))?;
        self.run_val(input, limits)
    }

    fn run_val(&self, input: Val, limits: &JqOutputLimits) -> Result<String, String> {
        let ctx = Ctx::<data::JustLut<Val>>::new(&self.filter.lut, Vars::new([]));
        // Not `jaq_core::unwrap_valr`: it exits the process when a program calls `halt`.
        let mut outputs = self.filter.id.run((ctx, input)).map(|output| {
            output.map_err(|exception| match exception.get_err() {
                Ok(error) => error.to_string(),
                Err(_) => "halt is not available in transforms".to_owned(),
            })
        });
        let first = match outputs.next() {
            None => return Err("jq program produced no value".to_owned()),
            Some(Err(error)) => return Err(format!("jq error: {error}")),
            Some(Ok(value)) => value,
        };
        if outputs.next().is_some() {
            return Err(
                "jq program produced more than one value; wrap it in [...] to collect them"
                    .to_owned(),
            );
        }
        // jaq's values only serialise through their JSON text.
        let text = first.to_string();
        limits.check(&text)?;
        Ok(text)
    }
}

/// The JSON text a program produced, as a value.
pub fn parse_output(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|_| {
        let shown: String = text.chars().take(200).collect();
        format!("jq program produced a value that is not JSON: {shown}")
    })
}

/// How large and how deep a transform's result may be: the same ceilings as an agent's result
/// (a coordinator passes its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JqOutputLimits {
    pub max_bytes: usize,
    pub max_depth: usize,
}

impl Default for JqOutputLimits {
    fn default() -> Self {
        Self {
            max_bytes: 64 << 20,
            max_depth: 100,
        }
    }
}

impl JqOutputLimits {
    fn check(&self, text: &str) -> Result<(), String> {
        if text.len() > self.max_bytes {
            return Err(format!(
                "jq program produced {} bytes; a step's data may be at most {} bytes",
                text.len(),
                self.max_bytes
            ));
        }
        let depth = text_nesting_depth(text);
        if depth > self.max_depth {
            return Err(format!(
                "jq program produced a value nested {depth} levels deep; the limit is {}",
                self.max_depth
            ));
        }
        Ok(())
    }
}

/// Which evaluation of a run a jq program's run is: the step visit (and map item) whose data it
/// gives, or the items of a map step's visit. Each is evaluated at most once in a run, so a
/// runner that records outcomes can name each by [`JqSite::key`] and hand it back on a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JqSite<'a> {
    pub step_id: &'a str,
    pub visit: u32,
    /// The map item whose chain the transform is in.
    pub item: Option<u32>,
    /// The evaluation gives a map step's `items`, not a step's data.
    pub items: bool,
}

impl JqSite<'_> {
    /// `<step>#<visit>`, `<step>[<item>]#<visit>` (the key the step visit's result is stored
    /// under), or `<step>#<visit>/items` for a map step's items.
    pub fn key(&self) -> String {
        use std::fmt::Write as _;
        let mut key = String::with_capacity(self.step_id.len() + 16);
        key.push_str(self.step_id);
        if let Some(item) = self.item {
            let _ = write!(key, "[{item}]");
        }
        let _ = write!(key, "#{}", self.visit);
        if self.items {
            key.push_str("/items");
        }
        key
    }
}

/// Where `jq:` transforms run. Without one installed they run in the calling thread, with no
/// budget; a coordinator installs one that runs them in processes with a CPU and memory budget,
/// and records each outcome by its site so that a replay reads it back instead of running the
/// program again.
pub trait JqRunner: Send + Sync {
    /// The program's single output on `document`, or the error that fails the step.
    fn run(
        &self,
        site: &JqSite<'_>,
        program: &JqProgram,
        document: &Value,
    ) -> Result<Value, String>;

    /// Whether a transition that took up a run's computation ([`crate::Event::Continue`]) may
    /// go on into one more step that runs jq, rather than stop before it. The runner's caller
    /// decides (a slice of CPU time per turn, so that cheap programs are not a transition each)
    /// and records each answer, so that a replay gets the same ones. Without a runner, never.
    fn go_on(&self) -> bool {
        false
    }
}

static RUNNER: OnceLock<Box<dyn JqRunner>> = OnceLock::new();

/// Installs the process's jq runner; `false` when one was installed already. Where transforms
/// run is a property of the process (which binary, which budgets), like its allocator, and the
/// engine stays a pure function of its inputs either way, so it is set once, not threaded
/// through every transition.
pub fn install_jq_runner(runner: Box<dyn JqRunner>) -> bool {
    RUNNER.set(runner).is_ok()
}

/// Whether a transition that took up a run's computation may go on into another step that runs
/// jq ([`JqRunner::go_on`]).
pub(crate) fn go_on_installed() -> bool {
    RUNNER.get().is_some_and(|runner| runner.go_on())
}

/// Runs `program` through the installed runner, or in this thread.
pub(crate) fn run_installed(
    site: &JqSite<'_>,
    program: &JqProgram,
    document: &Value,
) -> Result<Value, String> {
    match RUNNER.get() {
        Some(runner) => runner.run(site, program, document),
        None => program.run(document),
    }
}

fn describe_load_errors<P>(source: &str, errors: jaq_core::load::Errors<&str, P>) -> String {
    use jaq_core::load::Error;
    let column = |at: &str| source.len().saturating_sub(at.len()) + 1;
    let mut problems = Vec::new();
    for (_, error) in errors {
        match error {
            Error::Io(io) => {
                problems.extend(io.into_iter().map(|(path, why)| format!("{path}: {why}")))
            }
            Error::Lex(lex) => problems.extend(lex.into_iter().map(|(expect, at)| {
                format!("expected {} at column {}", expect.as_str(), column(at))
            })),
            Error::Parse(parse) => problems.extend(parse.into_iter().map(|(expect, at)| {
                format!("expected {} at column {}", expect.as_str(), column(at))
            })),
        }
    }
    format!("cannot parse jq program: {}", problems.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn programs_can_be_shared_between_threads() {
        assert_send_sync::<JqProgram>();
    }

    #[test]
    fn reshapes_the_context() {
        let document = json!({"input": "x", "context": {"plan": {"files": ["a.ts", "b.ts"]}}});
        let program = JqProgram::compile("[.context.plan.files[] | ascii_upcase]").unwrap();
        assert_eq!(program.run(&document), Ok(json!(["A.TS", "B.TS"])));
        let program = JqProgram::compile(
            "{count: (.context.plan.files | length), first: .context.plan.files[0]}",
        )
        .unwrap();
        assert_eq!(
            program.run(&document),
            Ok(json!({"count": 2, "first": "a.ts"}))
        );
    }

    #[test]
    fn results_obey_the_size_and_depth_limits_of_an_agent_s_result() {
        let limits = JqOutputLimits {
            max_bytes: 10,
            max_depth: 3,
        };
        let document = br#"{"input": 1, "context": {}}"#;
        let big = JqProgram::compile("\"abcdefghij\"").unwrap();
        assert_eq!(
            big.run_json(document, &limits),
            Err("jq program produced 12 bytes; a step's data may be at most 10 bytes".into())
        );
        let deep = JqProgram::compile("[[[[1]]]]").unwrap();
        assert_eq!(
            deep.run_json(document, &limits),
            Err("jq program produced a value nested 4 levels deep; the limit is 3".into())
        );
        let fits = JqProgram::compile("[[[.input]]]").unwrap();
        assert_eq!(fits.run_json(document, &limits), Ok("[[[1]]]".into()));
    }

    #[test]
    fn output_must_be_exactly_one_value() {
        let document = json!({"context": {"plan": {"files": ["a", "b"]}}});
        let many = JqProgram::compile(".context.plan.files[]").unwrap();
        assert!(
            many.run(&document)
                .unwrap_err()
                .contains("more than one value")
        );
        let none = JqProgram::compile("empty").unwrap();
        assert!(none.run(&document).unwrap_err().contains("no value"));
        let error = JqProgram::compile("error(\"boom\")").unwrap();
        assert!(error.run(&document).unwrap_err().contains("boom"));
    }

    #[test]
    fn bad_programs_and_impure_builtins_are_rejected() {
        assert!(
            JqProgram::compile(".a | ")
                .unwrap_err()
                .contains("cannot parse")
        );
        assert!(JqProgram::compile("[.a").is_err());
        for impure in [
            "env",
            "$ENV",
            "now",
            "input",
            "inputs",
            "localtime",
            "import \"x\" as x; .",
        ] {
            assert!(
                JqProgram::compile(impure).is_err(),
                "{impure} must not compile"
            );
        }
    }

    /// Regression (found by the `jq` fuzz target): a long chain such as `.|.|...` or deep
    /// brackets overflowed the stack while compiling and aborted the process.
    #[test]
    fn deep_programs_compile_without_overflowing_a_small_stack() {
        let programs = [
            format!("{}.", ".|".repeat(8_000)),
            format!("{}{}", "[".repeat(8_000), "]".repeat(8_000)),
            format!("{}1", "-".repeat(16_000)),
            format!("1{}", ",1".repeat(8_000)),
        ];
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                for program in &programs {
                    let compiled = JqProgram::compile(program);
                    assert!(compiled.is_ok(), "{:?}", compiled.err());
                }
                assert!(JqProgram::compile(&"[".repeat(8_000)).is_err());
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn halt_fails_the_transform_instead_of_exiting_the_process() {
        let document = json!({});
        for program in ["halt", "halt_error", "halt_error(1)", "\"x\" | halt_error"] {
            let program = JqProgram::compile(program).unwrap();
            assert!(program.run(&document).is_err());
        }
        let debug = JqProgram::compile("1 | debug | stderr").unwrap();
        assert_eq!(debug.run(&document), Ok(json!(1)));
    }
}
