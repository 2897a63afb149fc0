//! `baton tokens`: principals and their tokens in a principals file, without hand-made hashes.
//! A new token is printed once, on stdout (so `> ci-token` keeps it), and only its SHA-256 is
//! written to the file; the file is edited in place, its comments and other principals kept,
//! and replaced whole (a coordinator watching it reads the old version or the new one).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use sha2::{Digest, Sha256};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Add a principal with a new token: prints the token once, writes its SHA-256.
    Add(AddArgs),
    /// Give a principal a new token; the old one stops working when coordinators read the file.
    Rotate(NamedArgs),
    /// Remove a principal.
    Remove(NamedArgs),
}

#[derive(clap::Args)]
struct FileArg {
    /// The principals file (`--auth-tokens` of the coordinators); made if missing.
    #[arg(long, default_value = "principals.toml")]
    principals: PathBuf,
}

#[derive(clap::Args)]
struct AddArgs {
    /// The principal's name, as it appears in logs and run records.
    name: String,
    /// Its roles, comma-separated: read, submit, approve, operate, worker, admin.
    #[arg(long, value_delimiter = ',', required = true)]
    roles: Vec<String>,
    /// For a worker principal: the only agents it may serve, comma-separated.
    #[arg(long, value_delimiter = ',')]
    agents: Option<Vec<String>>,
    /// At most this many of its runs running at once.
    #[arg(long)]
    max_running_runs: Option<u32>,
    /// At most this many submits a second, on each coordinator.
    #[arg(long)]
    submits_per_second: Option<f64>,
    #[command(flatten)]
    file: FileArg,
}

#[derive(clap::Args)]
struct NamedArgs {
    name: String,
    #[command(flatten)]
    file: FileArg,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Add(args) => {
            let path = &args.file.principals;
            let mut document = read(path)?;
            let token = new_token()?;
            add(&mut document, &args, &token)?;
            write(path, &document)?;
            announce(&token, &format!("principal `{}` added to", args.name), path);
        }
        Command::Rotate(args) => {
            let path = &args.file.principals;
            let mut document = read(path)?;
            let token = new_token()?;
            principal(&mut document, &args.name, path)?
                .insert("token_sha256", toml_edit::value(digest(&token)));
            write(path, &document)?;
            announce(
                &token,
                &format!("principal `{}`'s token changed in", args.name),
                path,
            );
        }
        Command::Remove(args) => {
            let path = &args.file.principals;
            let mut document = read(path)?;
            principal(&mut document, &args.name, path)?;
            principals(&mut document)?.remove(&args.name);
            write(path, &document)?;
            eprintln!("principal `{}` removed from {}", args.name, path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The token on stdout, alone, and what happened on stderr.
fn announce(token: &str, what: &str, path: &Path) {
    println!("{token}");
    eprintln!(
        "{what} {}; the token above is shown only now (the file keeps its SHA-256)",
        path.display()
    );
}

/// 256 bits from the system's random source, as 64 hex digits.
fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| anyhow::anyhow!("no random source: {error}"))?;
    Ok(hex::encode(bytes))
}

fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn read(path: &Path) -> anyhow::Result<toml_edit::DocumentMut> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => anyhow::bail!("cannot read {}: {error}", path.display()),
    };
    text.parse()
        .with_context(|| format!("{} is not TOML", path.display()))
}

/// The `[principals]` table, made if missing.
fn principals(document: &mut toml_edit::DocumentMut) -> anyhow::Result<&mut toml_edit::Table> {
    let entry = document.entry("principals").or_insert_with(|| {
        let mut table = toml_edit::Table::new();
        // `[principals.ci]` headers, not an empty `[principals]` above them.
        table.set_implicit(true);
        toml_edit::Item::Table(table)
    });
    entry
        .as_table_mut()
        .context("`principals` in the principals file is not a table")
}

/// The named principal's table.
fn principal<'d>(
    document: &'d mut toml_edit::DocumentMut,
    name: &str,
    path: &Path,
) -> anyhow::Result<&'d mut toml_edit::Table> {
    principals(document)?
        .get_mut(name)
        .and_then(toml_edit::Item::as_table_mut)
        .with_context(|| format!("{} has no principal `{name}`", path.display()))
}

fn add(document: &mut toml_edit::DocumentMut, args: &AddArgs, token: &str) -> anyhow::Result<()> {
    let path = &args.file.principals;
    let table = principals(document)?;
    anyhow::ensure!(
        !table.contains_key(&args.name),
        "{} already has a principal `{}`: `baton tokens rotate {}` gives it a new token",
        path.display(),
        args.name,
        args.name
    );
    let mut entry = toml_edit::Table::new();
    entry.insert("token_sha256", toml_edit::value(digest(token)));
    entry.insert("roles", toml_edit::value(strings(&args.roles)));
    if let Some(agents) = &args.agents {
        entry.insert("agents", toml_edit::value(strings(agents)));
    }
    if let Some(limit) = args.max_running_runs {
        entry.insert("max_running_runs", toml_edit::value(i64::from(limit)));
    }
    if let Some(rate) = args.submits_per_second {
        entry.insert("submits_per_second", toml_edit::value(rate));
    }
    table.insert(&args.name, toml_edit::Item::Table(entry));
    Ok(())
}

fn strings(items: &[String]) -> toml_edit::Array {
    items.iter().map(|item| item.trim()).collect()
}

/// Writes the file whole, by renaming a new one over it, readable by its owner only; first
/// checks that coordinators will read it (a role misspelled is refused here, naming it, not
/// when a coordinator next reads the file and keeps its old version).
fn write(path: &Path, document: &toml_edit::DocumentMut) -> anyhow::Result<()> {
    let text = document.to_string();
    baton_coordinator::auth::principals::parse(&text)
        .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    let mut next = path.as_os_str().to_owned();
    next.push(".next");
    let next = PathBuf::from(next);
    crate::pki::write_file(&next, &text, crate::pki::Secrecy::Secret, true)?;
    std::fs::rename(&next, path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add_args(name: &str, roles: &[&str], path: &Path) -> AddArgs {
        AddArgs {
            name: name.to_owned(),
            roles: roles.iter().map(|role| (*role).to_owned()).collect(),
            agents: None,
            max_running_runs: None,
            submits_per_second: None,
            file: FileArg {
                principals: path.to_owned(),
            },
        }
    }

    #[test]
    fn a_principal_added_is_found_by_its_token_and_the_file_keeps_its_comments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("principals.toml");
        let text = format!(
            "# who may do what\n[principals.alice]\ntoken_sha256 = \"{}\"\nroles = [\"read\"]\n",
            digest("alice's")
        );
        std::fs::write(&path, text).unwrap();
        let mut document = read(&path).unwrap();
        let token = new_token().unwrap();
        add(
            &mut document,
            &add_args("ci", &["submit", "read"], &path),
            &token,
        )
        .unwrap();
        write(&path, &document).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        assert!(written.starts_with("# who may do what\n"), "{written}");
        let principals = baton_coordinator::auth::principals::parse(&written).unwrap();
        assert_eq!(principals.by_token(&token).unwrap().name, "ci");
        assert_eq!(principals.by_token("alice's").unwrap().name, "alice");
        assert!(
            !written.contains(&token),
            "the token itself is never stored"
        );
    }

    #[test]
    fn a_name_taken_or_a_role_misspelled_is_refused_and_the_file_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("principals.toml");
        let mut document = read(&path).unwrap();
        add(&mut document, &add_args("ci", &["submit"], &path), "t1").unwrap();
        write(&path, &document).unwrap();
        let before = std::fs::read_to_string(&path).unwrap();

        let mut document = read(&path).unwrap();
        let error = add(&mut document, &add_args("ci", &["read"], &path), "t2").unwrap_err();
        assert!(error.to_string().contains("tokens rotate ci"), "{error}");

        let mut document = read(&path).unwrap();
        add(&mut document, &add_args("bob", &["sumbit"], &path), "t3").unwrap();
        let error = write(&path, &document).unwrap_err().to_string();
        assert!(error.contains("sumbit"), "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    }

    #[test]
    fn tokens_are_64_hex_digits_and_never_the_same() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
