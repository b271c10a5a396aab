//! TLS trust for `https://` daemons. Without a CA file: the system's roots. With one
//! (`--ca-cert`, `FORKVM_CA_CERT`): its certificates only, accepting a server whose
//! chain leads to one of them, or whose certificate *is* one of them — a self-signed
//! daemon certificate made by `openssl req -x509` says `CA:TRUE`, which webpki refuses
//! as an end entity, so an exact match is taken as a pin. The host name must match in
//! both cases, and the handshake signature is always checked.

use crate::error::{BoxError, ClientError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsConnector;

/// The TLS settings for `https://` endpoints (see the module doc).
pub(crate) fn connector(ca_file: Option<&Path>) -> Result<TlsConnector, ClientError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Tls { endpoint: "(any)".into(), source: e.into() })?;
    let mut config = match ca_file {
        Some(path) => {
            let err = |source: BoxError| ClientError::CaCert { path: path.to_path_buf(), source };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| err(e.into()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| err(e.into()))?;
            if certs.is_empty() {
                return Err(err("the file holds no PEM certificate".into()));
            }
            let verifier = CaFileVerifier::new(certs, provider).map_err(err)?;
            builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth()
        }
        None => {
            // Unreadable or unparsable system certificates are skipped: a daemon signed
            // by one of them fails the handshake with "unknown issuer", which says enough.
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// WebPKI verification against the CA file's certificates, plus exact pins on them.
#[derive(Debug)]
struct CaFileVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl CaFileVerifier {
    fn new(certs: Vec<CertificateDer<'static>>, provider: Arc<CryptoProvider>) -> Result<CaFileVerifier, BoxError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in &certs {
            roots.add(cert.clone())?;
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build()?;
        Ok(CaFileVerifier { webpki, pinned: certs })
    }
}

impl ServerCertVerifier for CaFileVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(_))
                if self.pinned.iter().any(|p| p.as_ref() == end_entity.as_ref()) =>
            {
                verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
