//! `baton certs`: the certificates a secured cluster needs, without PKI skills: `init` makes a
//! CA, a server certificate for the names the coordinators are reached by and a client
//! certificate; `server` and `client` sign more with that CA.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use crate::pki::{Authority, Purpose, Secrecy, Validity, write_file};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Make a CA (ca.pem, ca.key), a server certificate for --host names (server.pem,
    /// server.key) and a client certificate (client.pem, client.key) in --dir.
    Init(InitArgs),
    /// Sign another server certificate with the CA in --dir (a new name, or a renewal).
    Server(ServerArgs),
    /// Sign client certificates (mTLS) with the CA in --dir: NAME.pem and NAME.key for each
    /// NAME, which is also the certificate's DNS name (`client_cert_names` in principals.toml).
    Client(ClientArgs),
}

#[derive(clap::Args)]
struct Common {
    /// The folder of the CA and the certificates (made if missing).
    #[arg(long, default_value = "pki")]
    dir: PathBuf,
    /// Days the certificates made are valid.
    #[arg(long, default_value_t = 365)]
    days: u32,
    /// Replace files that exist (by default nothing is overwritten).
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct InitArgs {
    /// A DNS name or IP address clients reach the coordinators by; give one per name
    /// (`--host localhost --host coordinator.example`).
    #[arg(long = "host", required = true)]
    hosts: Vec<String>,
    /// The client certificate's name (its DNS name, and the files' name).
    #[arg(long, default_value = "client")]
    client: String,
    /// Days the CA is valid.
    #[arg(long, default_value_t = 3650)]
    ca_days: u32,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct ServerArgs {
    #[arg(long = "host", required = true)]
    hosts: Vec<String>,
    /// The files' name: NAME.pem and NAME.key.
    #[arg(long, default_value = "server")]
    name: String,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct ClientArgs {
    #[arg(required = true)]
    names: Vec<String>,
    #[command(flatten)]
    common: Common,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let written = match args.command {
        Command::Init(args) => init(&args)?,
        Command::Server(args) => {
            let ca = load_authority(&args.common.dir)?;
            vec![sign(
                &ca,
                &args.common,
                &args.name,
                &args.hosts,
                Purpose::Server,
            )?]
        }
        Command::Client(args) => {
            let ca = load_authority(&args.common.dir)?;
            args.names
                .iter()
                .map(|name| {
                    sign(
                        &ca,
                        &args.common,
                        name,
                        std::slice::from_ref(name),
                        Purpose::Client,
                    )
                })
                .collect::<anyhow::Result<_>>()?
        }
    };
    for path in written.iter().flat_map(|(cert, key)| [cert, key]) {
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn init(args: &InitArgs) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
    file_name(&args.client)?;
    let dir = &args.common.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let validity = Validity {
        ca_days: args.ca_days,
        leaf_days: args.common.days,
    };
    // Signed first, written after: a name refused leaves no half-made folder behind.
    let ca = Authority::new("Baton CA", validity)?;
    let server = ca.leaf(&args.hosts, Purpose::Server, validity.leaf_days)?;
    let client = ca.leaf(
        std::slice::from_ref(&args.client),
        Purpose::Client,
        validity.leaf_days,
    )?;
    let force = args.common.force;
    let pair = |name: &str, cert: &str, key: &str| -> anyhow::Result<(PathBuf, PathBuf)> {
        Ok((
            write_file(
                &dir.join(format!("{name}.pem")),
                cert,
                Secrecy::Public,
                force,
            )?,
            write_file(
                &dir.join(format!("{name}.key")),
                key,
                Secrecy::Secret,
                force,
            )?,
        ))
    };
    // Checked before anything is written, so a refusal leaves the folder as it was.
    if !force {
        for name in ["ca", "server", args.client.as_str()] {
            for extension in ["pem", "key"] {
                let path = dir.join(format!("{name}.{extension}"));
                anyhow::ensure!(
                    !path.exists(),
                    "{} already exists; pass --force to replace it (certificates signed by a replaced CA stop being trusted)",
                    path.display()
                );
            }
        }
    }
    Ok(vec![
        pair("ca", &ca.cert_pem, &ca.key_pem)?,
        pair("server", &server.cert_pem, &server.key_pem)?,
        pair(&args.client, &client.cert_pem, &client.key_pem)?,
    ])
}

/// The CA `init` wrote in `dir`.
fn load_authority(dir: &Path) -> anyhow::Result<Authority> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} (make the CA first: baton certs init --dir {} --host NAME)",
                path.display(),
                dir.display()
            )
        })
    };
    Authority::load(&read("ca.pem")?, &read("ca.key")?)
}

/// Signs one leaf certificate and writes NAME.pem and NAME.key.
fn sign(
    ca: &Authority,
    common: &Common,
    name: &str,
    names: &[String],
    purpose: Purpose,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    file_name(name)?;
    let leaf = ca.leaf(names, purpose, common.days)?;
    let dir = &common.dir;
    Ok((
        write_file(
            &dir.join(format!("{name}.pem")),
            &leaf.cert_pem,
            Secrecy::Public,
            common.force,
        )?,
        write_file(
            &dir.join(format!("{name}.key")),
            &leaf.key_pem,
            Secrecy::Secret,
            common.force,
        )?,
    ))
}

/// A certificate's name is also its files' name: letters, digits, `.`, `-` and `_`, so that it
/// can only name a file in the folder.
fn file_name(name: &str) -> anyhow::Result<()> {
    let fits = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    anyhow::ensure!(
        fits,
        "`{name}` cannot name certificate files: use letters, digits, `.`, `-` and `_`"
    );
    Ok(())
}
