//! Certificates made by the tests: a CA, and leaf certificates it signs for servers and
//! clients, as PEM.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A test CA.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A certificate and its key, PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("the CA certificate");
        Ca {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// A certificate for `names` (DNS names or IP addresses), good for servers and clients.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        let key = KeyPair::generate().expect("a key");
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("leaf parameters");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a leaf certificate");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

impl Leaf {
    /// Writes `<name>.pem` and `<name>.key` into `dir`; their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        replace(&cert, &self.cert);
        replace(&key, &self.key);
        (cert, key)
    }
}

/// Writes a file by renaming a new one over it, as Kubernetes updates a mounted secret: a
/// reader sees the old file or the new one, never half of one.
pub fn replace(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).expect("write a file");
    std::fs::rename(&next, path).expect("rename it into place");
}
