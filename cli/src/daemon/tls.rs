//! The server side of TLS: `--tls-cert`, `--tls-key` and `--tls-client-ca`
//! loaded and checked into the rustls configurations of the client API
//! (ALPN `h2`) and of the metrics endpoint (`h2`, `http/1.1`).
//!
//! Every file is read and checked when the configuration is resolved,
//! before the node starts: a missing file, a file without what it should
//! hold, or a key that is not the certificate's is an error naming the
//! flag and the file. This module never accepts a connection (that is
//! `accept`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// The TLS files of `ringraft serve`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--tls-cert`: this node's certificate chain (PEM, its own first).
    pub cert: PathBuf,
    /// `--tls-key`: its private key (PEM).
    pub key: PathBuf,
    /// `--tls-client-ca`: when given, clients must present a certificate
    /// signed by one of these CAs (PEM).
    pub client_ca: Option<PathBuf>,
}

/// The checked server configurations, one per port kind.
#[derive(Clone)]
pub struct ServerTls {
    /// What they were loaded from.
    pub files: TlsFiles,
    /// The client API's (gRPC: ALPN `h2` only).
    pub grpc: Arc<ServerConfig>,
    /// The metrics endpoint's (ALPN `h2`, `http/1.1`).
    pub http: Arc<ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads and checks `files`.
    ///
    /// # Errors
    /// A message naming the flag and the file: unreadable, no certificate
    /// or key in it, a key that does not go with the certificate, a client
    /// CA that cannot be a trust anchor.
    pub fn load(files: TlsFiles) -> Result<ServerTls, String> {
        let chain = certificates(&files.cert, "--tls-cert")?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
            format!(
                "--tls-key {}: no private key read: {e}",
                files.key.display()
            )
        })?;
        let provider = ringraft_client::tls::crypto_provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(path, "--tls-client-ca")? {
                    roots.add(cert).map_err(|e| {
                        format!(
                            "--tls-client-ca {}: not a usable CA certificate: {e}",
                            path.display()
                        )
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(chain, key).map_err(|e| {
            format!(
                "--tls-key {} does not go with --tls-cert {} (is it the certificate's key?): {e}",
                files.key.display(),
                files.cert.display()
            )
        })?;
        let mut grpc = config.clone();
        grpc.alpn_protocols = vec![b"h2".to_vec()];
        let mut http = config;
        http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            files,
            grpc: Arc::new(grpc),
            http: Arc::new(http),
        })
    }

    /// Whether clients must present a certificate.
    pub fn client_auth(&self) -> bool {
        self.files.client_ca.is_some()
    }
}

/// The certificates of the PEM file `path` (at least one), given as `flag`.
fn certificates(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag} {}: no certificate in it (expected PEM, -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::certs::Ca;

    fn files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> TlsFiles {
        TlsFiles {
            cert: cert.into(),
            key: key.into(),
            client_ca: client_ca.map(Into::into),
        }
    }

    #[test]
    fn good_files_load_with_and_without_client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let node = Ca::new("ca").unwrap().write(dir.path(), "node").unwrap();
        let (ca, cert, key) = (node.ca, node.cert, node.key);
        let tls = ServerTls::load(files(&cert, &key, None)).unwrap();
        assert!(!tls.client_auth());
        assert_eq!(tls.grpc.alpn_protocols, vec![b"h2".to_vec()]);
        let tls = ServerTls::load(files(&cert, &key, Some(&ca))).unwrap();
        assert!(tls.client_auth());
    }

    /// Bad input is an error naming the flag and the file, never a panic.
    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let node = Ca::new("ca").unwrap().write(dir.path(), "node").unwrap();
        let (ca, cert, key) = (node.ca, node.cert, node.key);
        let other_key = Ca::new("other").unwrap().leaf("other").unwrap().key_pem;
        let other_key_path = dir.path().join("other-key.pem");
        std::fs::write(&other_key_path, other_key).unwrap();
        let other_key = other_key_path;
        let missing = dir.path().join("missing.pem");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a pem file\n").unwrap();
        for (what, files, expected) in [
            ("no cert file", files(&missing, &key, None), "--tls-cert"),
            ("no key file", files(&cert, &missing, None), "--tls-key"),
            (
                "cert is garbage",
                files(&garbage, &key, None),
                "no certificate",
            ),
            ("key is a cert", files(&cert, &cert, None), "no private key"),
            (
                "another key",
                files(&cert, &other_key, None),
                "does not go with",
            ),
            (
                "no client ca file",
                files(&cert, &key, Some(&missing)),
                "--tls-client-ca",
            ),
            (
                "client ca is garbage",
                files(&cert, &key, Some(&garbage)),
                "--tls-client-ca",
            ),
        ] {
            let err = ServerTls::load(files).unwrap_err();
            assert!(err.contains(expected), "{what}: {err}");
        }
        assert!(ServerTls::load(files(&cert, &key, Some(&ca))).is_ok());
    }
}
