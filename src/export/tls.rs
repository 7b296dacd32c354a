//! OTLP over TLS: the certificates the flags name (`--otlp-ca`, `--otlp-client-cert`,
//! `--otlp-client-key`, or the OpenTelemetry variables `OTEL_EXPORTER_OTLP_CERTIFICATE`,
//! `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`, `OTEL_EXPORTER_OTLP_CLIENT_KEY`), read and checked
//! once at start, and turned into the two transports' TLS settings: tonic's `ClientTlsConfig`
//! for gRPC and a reqwest blocking client for http/protobuf. Both are rustls with ring, and both
//! trust the system's CA certificates (`/etc/ssl/certs`, or `SSL_CERT_FILE` / `SSL_CERT_DIR`)
//! plus the `--otlp-ca` file; neither ever skips verification.
//!
//! An export that fails on TLS is reported by the pipeline's outage line; [`advice`] adds the
//! flag that fixes it (an unknown CA: `--otlp-ca`; a collector that asks for a client
//! certificate: `--otlp-client-cert` / `--otlp-client-key`).

use anyhow::{bail, Context};
use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A PEM file larger than this is not a certificate bundle (the system's whole store is ~200 KiB).
const MAX_PEM: u64 = 16 << 20;

/// The TLS files the flags name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Extra CA certificates (PEM) trusted beside the system's.
    pub ca: Option<PathBuf>,
    /// Client certificate chain (PEM), for a collector that asks for one (mTLS).
    pub client_cert: Option<PathBuf>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether any file is named.
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.client_cert.is_some() || self.client_key.is_some()
    }
}

/// The files read and checked: PEM text, as both transports take it.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// `--otlp-ca`'s PEM text.
    pub ca: Option<Vec<u8>>,
    /// `--otlp-client-cert` and `--otlp-client-key`, concatenated PEM (reqwest's form) and apart.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

fn read_pem(flag: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    let meta = std::fs::metadata(path).with_context(|| format!("{flag} {}: cannot read it", path.display()))?;
    if !meta.is_file() || meta.len() > MAX_PEM {
        bail!("{flag} {}: not a PEM file (a regular file of at most 16 MiB)", path.display());
    }
    std::fs::read(path).with_context(|| format!("{flag} {}: cannot read it", path.display()))
}

fn certificates(flag: &str, path: &Path, pem: &[u8]) -> anyhow::Result<usize> {
    let mut n = 0;
    for (i, c) in CertificateDer::pem_slice_iter(pem).enumerate() {
        c.map_err(|e| anyhow::anyhow!("{flag} {}: certificate {} is not valid PEM: {e:?}", path.display(), i + 1))?;
        n += 1;
    }
    if n == 0 {
        bail!("{flag} {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)", path.display());
    }
    Ok(n)
}

/// Reads and checks the files: each readable, PEM, with at least one certificate (or a key);
/// a client certificate needs its key and a key its certificate.
pub fn load(files: &TlsFiles) -> anyhow::Result<Loaded> {
    let ca = match &files.ca {
        Some(p) => {
            let pem = read_pem("--otlp-ca", p)?;
            certificates("--otlp-ca", p, &pem)?;
            Some(pem)
        }
        None => None,
    };
    let identity = match (&files.client_cert, &files.client_key) {
        (None, None) => None,
        (Some(c), None) => bail!("--otlp-client-cert {}: the client certificate needs its key (--otlp-client-key FILE)", c.display()),
        (None, Some(k)) => bail!("--otlp-client-key {}: the key needs its certificate (--otlp-client-cert FILE)", k.display()),
        (Some(c), Some(k)) => {
            let cert = read_pem("--otlp-client-cert", c)?;
            certificates("--otlp-client-cert", c, &cert)?;
            let key = read_pem("--otlp-client-key", k)?;
            PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                anyhow::anyhow!("--otlp-client-key {}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1): {e:?}", k.display())
            })?;
            Some((cert, key))
        }
    };
    Ok(Loaded { ca, identity })
}

/// Makes ring the process's rustls provider (reqwest takes the installed one; tonic names ring
/// itself). Idempotent: a second call finds it installed.
fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// tonic's TLS settings: the system roots, `--otlp-ca`, the client identity.
pub fn grpc_config(tls: &Loaded) -> ClientTlsConfig {
    install_provider();
    let mut c = ClientTlsConfig::new().with_native_roots();
    if let Some(ca) = &tls.ca {
        c = c.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some((cert, key)) = &tls.identity {
        c = c.identity(Identity::from_pem(cert, key));
    }
    c
}

/// The http/protobuf transport's client: reqwest's blocking client over rustls, trusting the
/// system roots and `--otlp-ca`, presenting the client identity, with `timeout` per request.
pub fn http_client(tls: &Loaded, timeout: Duration) -> anyhow::Result<reqwest::blocking::Client> {
    install_provider();
    let mut b = reqwest::blocking::Client::builder().timeout(timeout).tls_backend_rustls();
    if let Some(ca) = &tls.ca {
        let certs = reqwest::Certificate::from_pem_bundle(ca).context("--otlp-ca: reading the certificates")?;
        b = b.tls_certs_merge(certs);
    }
    if let Some((cert, key)) = &tls.identity {
        let mut pem = cert.clone();
        pem.push(b'\n');
        pem.extend_from_slice(key);
        b = b.identity(reqwest::Identity::from_pem(&pem).context("--otlp-client-cert/--otlp-client-key: reading the identity")?);
    }
    // reqwest's blocking client runs its own runtime and must not be built inside another one
    // (the gRPC pipeline's): build it on a thread of its own, as opentelemetry-otlp does.
    std::thread::spawn(move || b.build())
        .join()
        .map_err(|_| anyhow::anyhow!("building the OTLP/HTTP client panicked"))?
        .context("building the OTLP/HTTP client")
}

/// The latest transport error of an export, for the outage report.
pub type Detail = Arc<Mutex<Option<String>>>;

/// reqwest's blocking client as the OTLP exporter's HTTP client, keeping the text of a failed
/// request's error chain (the certificate rustls refused, the alert the collector sent) in
/// `detail`: the exporter itself reports any transport failure as "network error".
#[derive(Debug)]
pub struct KeepingErrors {
    inner: reqwest::blocking::Client,
    /// The last failure's text, taken by the outage report.
    pub detail: Detail,
}

impl KeepingErrors {
    /// Wraps `inner`.
    pub fn new(inner: reqwest::blocking::Client) -> KeepingErrors {
        KeepingErrors { inner, detail: Arc::new(Mutex::new(None)) }
    }
}

/// An error and its sources, on one line, repeats dropped (reqwest, hyper and rustls each
/// restate their source).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        let t = err.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = err.source();
    }
    parts.join(": ")
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for KeepingErrors {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let r = self.inner.send_bytes(request).await;
        if let Err(e) = &r {
            *self.detail.lock().unwrap_or_else(|p| p.into_inner()) = Some(chain(e.as_ref()));
        }
        r
    }
}

/// What to do about a failed export whose error text says it failed on TLS, if it did.
pub fn advice(error: &str) -> Option<&'static str> {
    let e = error.to_ascii_lowercase();
    if e.contains("unknownissuer") || e.contains("unknown issuer") || e.contains("badsignature") || e.contains("invalid peer certificate") {
        Some("the collector's certificate is not signed by a CA this host trusts: name its CA with --otlp-ca FILE (or add it to the system's CA certificates)")
    } else if e.contains("certificaterequired")
        || e.contains("certificate required")
        || e.contains("handshakefailure")
        || e.contains("handshake failure")
    {
        Some("the collector refused the TLS handshake; a collector that requires client certificates (mTLS) needs --otlp-client-cert FILE --otlp-client-key FILE")
    } else if e.contains("close_notify") || e.contains("badcertificate") || e.contains("bad certificate") {
        Some("the collector closed the TLS connection; if it requires client certificates (mTLS), give --otlp-client-cert FILE --otlp-client-key FILE")
    } else if e.contains("notvalidforname") || e.contains("not valid for name") {
        Some("the collector's certificate does not name the host of --otlp: use the name (or IP) its certificate was issued for")
    } else {
        None
    }
}

/// The export timeout the OpenTelemetry variables ask for, in milliseconds as the specification
/// has it (`OTEL_EXPORTER_OTLP_METRICS_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT`; 10 s).
pub fn env_timeout() -> Duration {
    ["OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
        .iter()
        .find_map(|v| std::env::var(v).ok().and_then(|s| s.trim().parse::<u64>().ok()))
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_refused_naming_the_flag_and_the_file() {
        let dir = std::env::temp_dir().join(format!("gpufrag-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = load(&TlsFiles { ca: Some(junk.clone()), ..TlsFiles::default() }).unwrap_err().to_string();
        assert!(e.starts_with("--otlp-ca ") && e.contains("junk.pem") && e.contains("no PEM certificate"), "{e}");
        let e = load(&TlsFiles { ca: Some(dir.join("absent.pem")), ..TlsFiles::default() }).unwrap_err();
        assert!(format!("{e:#}").contains("absent.pem") && format!("{e:#}").contains("No such file"), "{e:#}");
        let e = load(&TlsFiles { client_cert: Some(junk.clone()), ..TlsFiles::default() }).unwrap_err().to_string();
        assert!(e.contains("--otlp-client-key FILE"), "{e}");
        let e = load(&TlsFiles { ca: Some(dir.clone()), ..TlsFiles::default() }).unwrap_err().to_string();
        assert!(e.contains("not a PEM file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tls_failures_name_the_flag_that_fixes_them() {
        assert!(advice("invalid peer certificate: UnknownIssuer").unwrap().contains("--otlp-ca"));
        assert!(advice("received fatal alert: CertificateRequired").unwrap().contains("--otlp-client-cert"));
        assert!(advice("connection refused").is_none());
    }
}
