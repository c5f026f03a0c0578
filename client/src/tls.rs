//! TLS for the client: the CA that signed the nodes' certificates (and,
//! for nodes that require client certificates, this client's certificate
//! and key), checked when they are loaded, and how a failed connection is
//! told apart as a TLS failure.
//!
//! It owns the files' checks and the failure's words; it never connects
//! (the [`Client`](crate::Client) does) and trusts no other root: a client
//! with a [`ClientTls`] accepts only servers whose certificate chains to
//! its CA and names the host it dialled (the endpoint's host name or IP
//! address).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::ClientError;

/// The TLS settings of a [`Client`](crate::Client): its endpoints are
/// dialled over `https`, and a node is trusted only with a certificate
/// signed by the CA given here, for the host name or IP address of the
/// endpoint.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: ClientTlsConfig,
}

impl ClientTls {
    /// Trusts the CA certificates in `ca_pem` (PEM), and no client
    /// certificate.
    ///
    /// # Errors
    /// [`ClientError::Tls`] when `ca_pem` holds no certificate, or one that
    /// cannot be a trust anchor.
    pub fn new(ca_pem: &[u8]) -> Result<ClientTls, ClientError> {
        Self::build(ca_pem, "the CA", None)
    }

    /// Like [`ClientTls::new`], presenting the client certificate chain
    /// `cert_pem` (PEM, this client's certificate first) with its private
    /// key `key_pem` (PEM: PKCS#8, PKCS#1 or SEC1), for nodes that require
    /// client certificates.
    ///
    /// # Errors
    /// [`ClientError::Tls`] as [`ClientTls::new`], and when the certificate
    /// or the key is missing or malformed, or the key is not the
    /// certificate's.
    pub fn with_identity(
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<ClientTls, ClientError> {
        Self::build(
            ca_pem,
            "the CA",
            Some((cert_pem, "the certificate", key_pem, "the key")),
        )
    }

    /// Reads the CA (and, when given, the client certificate and key) from
    /// PEM files: what `ringraft --ca --cert --key` take.
    ///
    /// # Errors
    /// [`ClientError::Tls`] naming the file that cannot be read or does not
    /// hold what it should, or when the key is not the certificate's.
    pub fn from_files(
        ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> Result<ClientTls, ClientError> {
        let read = |flag: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|e| ClientError::Tls(format!("{flag} {}: {e}", path.display())))
        };
        let ca_pem = read("--ca", ca)?;
        let ca_name = format!("--ca {}", ca.display());
        match identity {
            None => Self::build(&ca_pem, &ca_name, None),
            Some((cert, key)) => {
                let cert_pem = read("--cert", cert)?;
                let key_pem = read("--key", key)?;
                Self::build(
                    &ca_pem,
                    &ca_name,
                    Some((
                        &cert_pem,
                        &format!("--cert {}", cert.display()),
                        &key_pem,
                        &format!("--key {}", key.display()),
                    )),
                )
            }
        }
    }

    /// Checks the PEM texts (`*_name` says where each came from in the
    /// errors) with rustls itself, the way tonic will use them, so that
    /// a bad file is an error now and not a failed handshake at the first
    /// call; then keeps them as tonic's configuration.
    fn build(
        ca_pem: &[u8],
        ca_name: &str,
        identity: Option<(&[u8], &str, &[u8], &str)>,
    ) -> Result<ClientTls, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca_pem, ca_name)? {
            roots.add(cert).map_err(|e| {
                ClientError::Tls(format!("{ca_name}: not a usable CA certificate: {e}"))
            })?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Tls(format!("TLS versions: {e}")))?
            .with_root_certificates(roots);
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
        if let Some((cert_pem, cert_name, key_pem, key_name)) = identity {
            let chain = certificates(cert_pem, cert_name)?;
            let key = PrivateKeyDer::from_pem_slice(key_pem)
                .map_err(|e| ClientError::Tls(format!("{key_name}: no private key: {e}")))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                ClientError::Tls(format!(
                    "{key_name} does not go with {cert_name} (is it the certificate's key?): {e}"
                ))
            })?;
            config = config.identity(Identity::from_pem(cert_pem, key_pem));
        }
        Ok(ClientTls { config })
    }

    /// tonic's configuration.
    pub(crate) fn config(&self) -> ClientTlsConfig {
        self.config.clone()
    }
}

/// The rustls crypto provider of ringraft's TLS, on both sides (the client
/// here, `ringraft serve`'s client API and metrics ports): *ring*, the
/// provider tonic's `tls-ring` uses too.
///
/// rustls 0.23.48 deprecated its *ring* provider because *ring* has no
/// post-quantum key exchange (X25519MLKEM768; aws-lc-rs has it, and
/// builds a large C library of its own): the key exchange is classical
/// (X25519, P-256, P-384).
#[allow(deprecated)]
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate of the PEM text `pem` (at least one); `name` says
/// where it came from.
fn certificates(pem: &[u8], name: &str) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ClientError::Tls(format!("{name}: not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(ClientError::Tls(format!(
            "{name}: no certificate in it (expected PEM, -----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok(certs)
}

/// What went wrong with TLS in `error` or its causes, in words a user can
/// act on; `None` when TLS was not the problem (the node may be down, or
/// busy: worth another try).
pub(crate) fn failure(error: &(dyn std::error::Error + 'static), tls: bool) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(why) = rustls_error(e) {
            return Some(if tls {
                format!("TLS failed: {why}{}", hint(why))
            } else {
                format!("TLS failed: {why}")
            });
        }
        // After the handshake (TLS 1.3: a client learns that its
        // certificate was refused only from the alert that follows), the
        // alert reaches us through h2, which keeps its words only.
        if let Some(alert) = alert_in(&e.to_string()) {
            return Some(format!(
                "TLS failed: received fatal alert: {alert}{}",
                alert_hint(alert)
            ));
        }
        if let Some(h2) = e.downcast_ref::<h2::Error>()
            && h2.reason() == Some(h2::Reason::INADEQUATE_SECURITY)
            && !tls
        {
            return Some(
                "the node serves TLS only and this client dialled plaintext: give the CA that \
                 signed the nodes' certificates (--ca)"
                    .into(),
            );
        }
        next = e.source();
    }
    None
}

/// The rustls error in `e`, directly or inside an I/O error (which hides
/// its inner error from `source()`).
fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    e.downcast_ref::<rustls::Error>().or_else(|| {
        e.downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    })
}

/// How rustls words a fatal alert it received (`rustls::Error::AlertReceived`).
const ALERT_RECEIVED: &str = "received fatal alert: ";

/// The name of the alert a text says was received.
fn alert_in(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once(ALERT_RECEIVED)?;
    let name = rest.split(|c: char| !c.is_ascii_alphanumeric()).next()?;
    (!name.is_empty()).then_some(name)
}

/// What to check after a received alert named `alert`.
fn alert_hint(alert: &str) -> &'static str {
    match alert {
        "CertificateRequired" => " (the node requires a client certificate: give --cert and --key)",
        "UnknownCA" | "BadCertificate" | "DecryptError" | "CertificateUnknown" => {
            " (the node refused this client's certificate: is it signed by the node's --tls-client-ca?)"
        }
        _ => "",
    }
}

/// What to check after `why`.
fn hint(why: &rustls::Error) -> &'static str {
    use rustls::{CertificateError, Error};
    match why {
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => " (the node's certificate is not signed by --ca)",
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => " (the node's certificate does not name the host or IP address of its endpoint)",
        Error::AlertReceived(alert) => alert_hint(&format!("{alert:?}")),
        Error::InvalidMessage(_) => " (does the node serve TLS? a plaintext node answers so)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA's certificate and a leaf certificate and key it signed (PEM).
    fn ca_and_leaf() -> (String, String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        (ca.pem(), leaf.pem(), leaf_key.serialize_pem())
    }

    fn tls_error(result: Result<ClientTls, ClientError>) -> String {
        match result {
            Err(ClientError::Tls(why)) => why,
            Err(other) => panic!("not a TLS error: {other}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn good_files_load() {
        let (ca, cert, key) = ca_and_leaf();
        ClientTls::new(ca.as_bytes()).unwrap();
        ClientTls::with_identity(ca.as_bytes(), cert.as_bytes(), key.as_bytes()).unwrap();
    }

    /// Bad input is an error that says what is wrong with which file,
    /// never a panic, and never a failed handshake later.
    #[test]
    fn bad_files_are_clear_errors() {
        let (ca, cert, key) = ca_and_leaf();
        let (_, _, other_key) = ca_and_leaf();
        let why = tls_error(ClientTls::new(b"not pem"));
        assert!(why.contains("no certificate"), "{why}");
        let why = tls_error(ClientTls::new(key.as_bytes()));
        assert!(why.contains("no certificate"), "a key is no CA: {why}");
        let why = tls_error(ClientTls::with_identity(
            ca.as_bytes(),
            cert.as_bytes(),
            other_key.as_bytes(),
        ));
        assert!(why.contains("does not go with"), "{why}");
        let why = tls_error(ClientTls::with_identity(
            ca.as_bytes(),
            cert.as_bytes(),
            b"",
        ));
        assert!(why.contains("no private key"), "{why}");
        let dir = std::env::temp_dir().join(format!("ringraft-client-tls-{}", std::process::id()));
        let missing = dir.join("missing.pem");
        let why = tls_error(ClientTls::from_files(&missing, None));
        assert!(why.contains("--ca") && why.contains("missing.pem"), "{why}");
    }

    /// A certificate failure is told apart, with what to check; other
    /// errors are not TLS failures.
    #[test]
    fn tls_failures_are_told_apart_with_a_hint() {
        use rustls::{AlertDescription, CertificateError, Error};
        // The words h2 keeps of an alert received after the handshake.
        assert_eq!(
            Error::AlertReceived(AlertDescription::CertificateRequired).to_string(),
            format!("{ALERT_RECEIVED}CertificateRequired")
        );
        let h2_words = std::io::Error::other("connection error: received fatal alert: UnknownCA");
        let why = failure(&h2_words, true).unwrap();
        assert!(why.contains("--tls-client-ca"), "{why}");
        let io = |e: Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let unknown = io(Error::InvalidCertificate(CertificateError::UnknownIssuer));
        let why = failure(&unknown, true).unwrap();
        assert!(why.contains("not signed by --ca"), "{why}");
        let required = io(Error::AlertReceived(AlertDescription::CertificateRequired));
        let why = failure(&required, true).unwrap();
        assert!(why.contains("--cert and --key"), "{why}");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(failure(&refused, true).is_none());
    }
}
