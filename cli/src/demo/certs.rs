//! Throwaway TLS material for `ringraft demo --tls` and the tests: a CA made
//! on the spot (rcgen, ECDSA P-256) and the certificates it signs, for
//! `127.0.0.1` and `localhost` (the names the demo's endpoints dial).
//!
//! Nothing here is for production: the CA's key lives as long as the
//! process and is written nowhere; the leaves' keys are written into the
//! demo's own directory.

use std::path::{Path, PathBuf};

/// The names every leaf certificate holds: the demo's nodes listen on
/// loopback and are dialled by IP address.
const LEAF_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

/// A CA made on the spot.
pub(crate) struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The CA certificate, PEM.
    pub(crate) pem: String,
}

/// A certificate and its private key, PEM.
pub(crate) struct Leaf {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

/// Where [`Ca::write`] put the files.
#[derive(Clone, Debug)]
pub(crate) struct Files {
    pub(crate) ca: PathBuf,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl Ca {
    /// A new CA named `name`.
    pub(crate) fn new(name: &str) -> Result<Ca, String> {
        let fail = |e: rcgen::Error| format!("making a CA: {e}");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let key = rcgen::KeyPair::generate().map_err(fail)?;
        let cert = params.self_signed(&key).map_err(fail)?;
        Ok(Ca {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// A certificate for `127.0.0.1` and `localhost`, signed by this CA,
    /// good for a server and a client alike.
    pub(crate) fn leaf(&self, common_name: &str) -> Result<Leaf, String> {
        let fail = |e: rcgen::Error| format!("making a certificate: {e}");
        let mut params =
            rcgen::CertificateParams::new(LEAF_NAMES.map(String::from).to_vec()).map_err(fail)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().map_err(fail)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(fail)?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes the CA certificate and a new leaf named `name` into `dir`
    /// (`ca.pem`, `<name>.pem`, `<name>-key.pem`, the key readable by its
    /// owner only).
    pub(crate) fn write(&self, dir: &Path, name: &str) -> Result<Files, String> {
        let leaf = self.leaf(name)?;
        let files = Files {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        write(&files.ca, &self.pem, 0o644)?;
        write(&files.cert, &leaf.cert_pem, 0o644)?;
        write(&files.key, &leaf.key_pem, 0o600)?;
        Ok(files)
    }
}

/// Writes `text` to `path`, created with `mode`.
fn write(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}
