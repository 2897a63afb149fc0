//! A small certificate authority for a Baton cluster: a CA, server certificates for the names a
//! coordinator is reached by, and client certificates for mTLS, as PEM files with the modes an
//! operator expects (keys readable by their owner only).
//!
//! Every certificate is X.509 v3 with a subjectAltName (rustls refuses v1 certificates, which
//! `openssl x509 -req` makes by default, and ignores the common name), and a leaf certificate
//! says what it is for (server or client authentication).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A coordinator's port (TLS): valid for the names clients reach it by.
    Server,
    /// A client or worker (mTLS): its DNS name names its principal (`client_cert_names`).
    Client,
}

/// How long certificates are valid, from today.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    pub ca_days: u32,
    pub leaf_days: u32,
}

/// A CA that can sign leaf certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate and its private key, PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Authority {
    /// A new CA named `name`.
    pub fn new(name: &str, validity: Validity) -> anyhow::Result<Authority> {
        let key = KeyPair::generate().context("cannot generate the CA's key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params, validity.ca_days)?;
        let cert = params.self_signed(&key)?;
        Ok(Authority {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA whose certificate and key `init` wrote, to sign more leaf certificates with.
    pub fn load(cert_pem: &str, key_pem: &str) -> anyhow::Result<Authority> {
        let key = KeyPair::from_pem(key_pem).context("the CA key is not a PEM private key")?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, KeyPair::from_pem(key_pem)?)
            .context("the CA certificate is not a PEM certificate")?;
        Ok(Authority {
            issuer,
            cert_pem: cert_pem.to_owned(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A leaf certificate for `names` (DNS names or IP addresses), signed by this CA.
    pub fn leaf(&self, names: &[String], purpose: Purpose, days: u32) -> anyhow::Result<Leaf> {
        let first = names
            .first()
            .context("a certificate needs at least one name")?;
        let key = KeyPair::generate().context("cannot generate a key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = names
            .iter()
            .map(|name| subject_alt_name(name))
            .collect::<anyhow::Result<_>>()?;
        params.distinguished_name.push(DnType::CommonName, first);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![match purpose {
            Purpose::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Purpose::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        set_validity(&mut params, days)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// An IP address as an IP name, anything else as a DNS name (checked as one).
fn subject_alt_name(name: &str) -> anyhow::Result<SanType> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    // What a client will check the name against: rcgen takes any ASCII.
    let valid = rustls::pki_types::DnsName::try_from(name).is_ok();
    let dns = name
        .try_into()
        .ok()
        .filter(|_| valid)
        .ok_or_else(|| anyhow::anyhow!("`{name}` is neither a DNS name nor an IP address"))?;
    Ok(SanType::DnsName(dns))
}

/// Valid from yesterday (clocks differ) for `days` days.
fn set_validity(params: &mut CertificateParams, days: u32) -> anyhow::Result<()> {
    let today = jiff::Zoned::now().date();
    let date = |date: jiff::civil::Date| {
        let month = u8::try_from(date.month()).unwrap_or(1);
        let day = u8::try_from(date.day()).unwrap_or(1);
        rcgen::date_time_ymd(i32::from(date.year()), month, day)
    };
    params.not_before = date(today.yesterday()?);
    params.not_after = date(today.checked_add(jiff::Span::new().days(i64::from(days)))?);
    Ok(())
}

/// Whether a file holds a secret: keys are written for their owner only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secrecy {
    Public,
    Secret,
}

/// Writes `text` to `path` with the mode its secrecy asks for (0644 or 0600), never over an
/// existing file unless `overwrite`: replacing a CA by accident strands every certificate it
/// signed.
pub fn write_file(
    path: &Path,
    text: &str,
    secrecy: Secrecy,
    overwrite: bool,
) -> anyhow::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mode = match secrecy {
        Secrecy::Public => 0o644,
        Secrecy::Secret => 0o600,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(mode);
    if overwrite {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path).map_err(|error| {
        if error.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow::anyhow!(
                "{} already exists; pass --force to replace it (certificates signed by a replaced CA stop being trusted)",
                path.display()
            )
        } else {
            anyhow::anyhow!("cannot write {}: {error}", path.display())
        }
    })?;
    // An existing file keeps its mode through open(): set it.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.to_owned())
}

#[cfg(test)]
mod tests {
    use rustls::client::danger::ServerCertVerifier as _;

    use super::*;

    const VALIDITY: Validity = Validity {
        ca_days: 3650,
        leaf_days: 365,
    };

    /// The certificate's DER, from its PEM.
    fn der(pem: &str) -> Vec<u8> {
        rustls_pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
            .map(|cert: rustls_pki_types::CertificateDer<'static>| cert.to_vec())
            .expect("a PEM certificate")
    }

    #[test]
    fn a_server_certificate_verifies_for_each_of_its_names_and_no_other() {
        let ca = Authority::new("test CA", VALIDITY).unwrap();
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let leaf = ca.leaf(&names, Purpose::Server, 365).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&ca.cert_pem).into()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder(roots.into())
            .build()
            .unwrap();
        let cert = der(&leaf.cert_pem).into();
        let now = rustls_pki_types::UnixTime::now();
        for name in ["localhost", "127.0.0.1"] {
            let server = rustls_pki_types::ServerName::try_from(name).unwrap();
            verifier
                .verify_server_cert(&cert, &[], &server, &[], now)
                .unwrap_or_else(|error| panic!("{name}: {error}"));
        }
        let other = rustls_pki_types::ServerName::try_from("coordinator.example").unwrap();
        let error = verifier
            .verify_server_cert(&cert, &[], &other, &[], now)
            .unwrap_err();
        assert!(error.to_string().contains("localhost"), "{error}");
    }

    #[test]
    fn a_name_that_is_neither_dns_nor_ip_is_refused_naming_it() {
        let ca = Authority::new("test CA", VALIDITY).unwrap();
        let error = ca
            .leaf(&["bad name!".to_owned()], Purpose::Server, 1)
            .err()
            .unwrap();
        assert!(error.to_string().contains("`bad name!`"), "{error}");
    }

    #[test]
    fn keys_are_written_for_their_owner_only_and_nothing_is_overwritten_unasked() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("a.key");
        write_file(&key, "secret", Secrecy::Secret, false).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let error = write_file(&key, "other", Secrecy::Secret, false).unwrap_err();
        assert!(error.to_string().contains("--force"), "{error}");
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "secret");
        write_file(&key, "other", Secrecy::Public, true).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn a_loaded_authority_signs_certificates_its_certificate_verifies() {
        let ca = Authority::new("test CA", VALIDITY).unwrap();
        let again = Authority::load(&ca.cert_pem, &ca.key_pem).unwrap();
        let leaf = again
            .leaf(&["worker-1".to_owned()], Purpose::Client, 30)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&ca.cert_pem).into()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder(roots.into())
            .build()
            .unwrap();
        verifier
            .verify_client_cert(
                &der(&leaf.cert_pem).into(),
                &[],
                rustls_pki_types::UnixTime::now(),
            )
            .unwrap();
    }
}
