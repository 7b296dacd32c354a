//! OTLP over TLS to the real collector of the tests (rotel-agent) behind a TLS terminator
//! (`export_support/tls_proxy.py`, Python's OpenSSL: rotel's receivers have no TLS option), with a
//! CA, a server certificate for 127.0.0.1 and a client certificate made here by openssl(1):
//! TLS over gRPC and over HTTP with `--otlp-ca`, the system roots (`SSL_CERT_FILE`) without it,
//! mTLS accepted, mTLS without a client certificate refused, and a wrong CA refused, each refusal
//! as one line naming the flag that fixes it.

#![allow(clippy::unwrap_used)]

mod export_support;
mod tool_support;

use export_support::*;
use gpufrag::export::otlp::Protocol;
use gpufrag::export::{self, ExportArgs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The tests of this file one at a time: one of them sets `SSL_CERT_FILE` for the process.
static SERIAL: Mutex<()> = Mutex::new(());

/// The certificates of one test.
struct Pki {
    ca: PathBuf,
    other_ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).stdin(Stdio::null()).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA, a second CA that signed nothing of ours, a server certificate for 127.0.0.1 and a
/// client certificate, all P-256, valid for two days.
fn make_pki(dir: &Path) -> Pki {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    for ca in ["ca", "other-ca"] {
        let (key, pem, subj) = (format!("{ca}.key"), format!("{ca}.pem"), format!("/CN=gpufrag test {ca}"));
        let mut a = vec!["req", "-x509"];
        a.extend(ec);
        a.extend(["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj]);
        openssl(dir, &a);
    }
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n").unwrap();
    for leaf in ["server", "client"] {
        let (key, csr, pem, ext) = (format!("{leaf}.key"), format!("{leaf}.csr"), format!("{leaf}.pem"), format!("{leaf}.ext"));
        let mut a = vec!["req", "-new"];
        a.extend(ec);
        let subj = format!("/CN=gpufrag test {leaf}");
        a.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(dir, &a);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
    Pki {
        ca: dir.join("ca.pem"),
        other_ca: dir.join("other-ca.pem"),
        server: (dir.join("server.pem"), dir.join("server.key")),
        client: (dir.join("client.pem"), dir.join("client.key")),
    }
}

/// rotel-agent and a TLS terminator in front of the receiver of `protocol`.
struct Collector {
    rotel: Rotel,
    _proxy: Guard,
    url: String,
}

fn start(bin: &Path, dir: &Path, pki: &Pki, protocol: Protocol, require_client_cert: bool) -> Option<Collector> {
    let python = require("python3", which("python3"), "apt-get install python3")?;
    let rotel = Rotel::start(bin, dir, free_port(), free_port());
    let (upstream, alpn) = match protocol {
        Protocol::Grpc => (rotel.grpc, "h2"),
        Protocol::HttpProtobuf => (rotel.http, "http/1.1"),
    };
    let port = free_port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/export_support/tls_proxy.py");
    let mut cmd = Command::new(python);
    cmd.arg(script).arg(port.to_string()).arg(upstream.to_string()).arg(&pki.server.0).arg(&pki.server.1).arg(alpn);
    if require_client_cert {
        cmd.arg(&pki.ca);
    }
    let log = std::fs::File::create(dir.join(format!("proxy-{port}.log"))).unwrap();
    let child = cmd.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
    let proxy = Guard { child, name: "tls_proxy" };
    assert!(wait_listening(port, Duration::from_secs(10)), "the TLS proxy did not listen on {port}");
    Some(Collector { rotel, _proxy: proxy, url: format!("https://127.0.0.1:{port}") })
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()))
}

/// What one export run gave: OTLP exports delivered, the log lines, and what rotel received.
struct Outcome {
    delivered: u64,
    lines: Vec<String>,
    got: Vec<Received>,
    pid: u32,
}

fn export_to(c: &Collector, protocol: Protocol, ca: Option<&Path>, client: Option<&(PathBuf, PathBuf)>, expect_data: bool) -> Outcome {
    let sleeper = stand_in_process();
    let pid = sleeper.child.id();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let l2 = lines.clone();
    let args = ExportArgs {
        otlp: Some(c.url.clone()),
        otlp_protocol: Some(protocol),
        otlp_interval: Some(Duration::from_millis(400)),
        otlp_ca: ca.map(Path::to_path_buf),
        otlp_client_cert: client.map(|c| c.0.clone()),
        otlp_client_key: client.map(|c| c.1.clone()),
        nvml_lib: Some("none".into()),
        ..ExportArgs::default()
    };
    let mut exporter = export::exporter_from_args(&args, Arc::new(move |s: &str| l2.lock().unwrap().push(s.to_string()))).unwrap();
    export::replay(&frag_oom_events(pid), &mut exporter, Duration::from_millis(1000));
    let pid_s = pid.to_string();
    let within = if expect_data { Duration::from_secs(10) } else { Duration::from_millis(500) };
    let got = c.rotel.wait_for(within, |g| !points(g, "gpufrag.process.memory.reserved", &[("process.pid", &pid_s)]).is_empty());
    let lines = lines.lock().unwrap().clone();
    Outcome { delivered: exporter.otlp_delivered(), lines, got, pid }
}

fn assert_delivered(o: &Outcome, what: &str) {
    let pid_s = o.pid.to_string();
    let p = points(&o.got, "gpufrag.process.memory.reserved", &[("process.pid", &pid_s)]);
    assert!(
        o.delivered >= 2 && !p.is_empty(),
        "{what}: {} exports delivered, {} points arrived; log {:?}",
        o.delivered,
        o.got.len(),
        o.lines
    );
    assert_eq!(p.last().unwrap().value, RESERVED.to_string(), "{what}");
    assert!(o.lines.is_empty(), "{what}: no failure expected: {:?}", o.lines);
}

fn assert_refused(o: &Outcome, what: &str, flag: &str) {
    assert_eq!(o.delivered, 0, "{what}: nothing may be delivered; log {:?}", o.lines);
    let pid_s = o.pid.to_string();
    let mine = o.got.iter().filter(|r| r.attrs.get("process.pid") == Some(&pid_s)).count();
    assert_eq!(mine, 0, "{what}: the collector received {mine} points of pid {pid_s}");
    // The outage's report (the final export's failure at shutdown is said on a line of its own).
    let fail: Vec<&String> = o.lines.iter().filter(|l| l.contains("OTLP export to")).collect();
    assert_eq!(fail.len(), 1, "{what}: one report of the outage: {:?}", o.lines);
    assert!(!fail[0].contains('\n'), "{what}: one line: {}", fail[0]);
    assert!(fail[0].contains(flag), "{what}: the report names {flag}: {}", fail[0]);
    eprintln!("{what}: {}", fail[0]);
}

fn setup(name: &str) -> Option<(PathBuf, PathBuf, Pki)> {
    let bin = require("rotel-agent", rotel_agent(), "pip install rotel")?;
    require("openssl", which("openssl"), "apt-get install openssl")?;
    let dir = temp_dir(name);
    let pki = make_pki(&dir);
    Some((bin, dir, pki))
}

#[test]
fn tls_grpc_and_http_deliver_with_otlp_ca() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((bin, dir, pki)) = setup("otlp-tls") else { return };
    for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
        let Some(c) = start(&bin, &dir, &pki, protocol, false) else { return };
        let o = export_to(&c, protocol, Some(&pki.ca), None, true);
        assert_delivered(&o, &format!("TLS {}", protocol.name()));
    }
    cleanup(&dir);
}

/// Without `--otlp-ca` the system's store is trusted: here `SSL_CERT_FILE` (which
/// rustls-native-certs reads, as OpenSSL does) names the test CA.
#[test]
fn tls_trusts_the_system_roots_without_otlp_ca() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((bin, dir, pki)) = setup("otlp-tls-roots") else { return };
    for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
        let Some(c) = start(&bin, &dir, &pki, protocol, false) else { return };
        let refused = export_to(&c, protocol, None, None, false);
        assert_refused(&refused, &format!("{} with the default store", protocol.name()), "--otlp-ca FILE");
        std::env::set_var("SSL_CERT_FILE", &pki.ca);
        let o = export_to(&c, protocol, None, None, true);
        std::env::remove_var("SSL_CERT_FILE");
        assert_delivered(&o, &format!("TLS {} through SSL_CERT_FILE", protocol.name()));
    }
    cleanup(&dir);
}

#[test]
fn mtls_is_accepted_with_a_client_certificate_and_refused_without() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((bin, dir, pki)) = setup("otlp-mtls") else { return };
    for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
        let Some(c) = start(&bin, &dir, &pki, protocol, true) else { return };
        let o = export_to(&c, protocol, Some(&pki.ca), Some(&pki.client), true);
        assert_delivered(&o, &format!("mTLS {}", protocol.name()));
        let o = export_to(&c, protocol, Some(&pki.ca), None, false);
        assert_refused(&o, &format!("mTLS {} without a client certificate", protocol.name()), "--otlp-client-cert FILE");
    }
    cleanup(&dir);
}

#[test]
fn a_wrong_ca_is_refused_naming_otlp_ca() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((bin, dir, pki)) = setup("otlp-tls-wrong-ca") else { return };
    for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
        let Some(c) = start(&bin, &dir, &pki, protocol, false) else { return };
        let o = export_to(&c, protocol, Some(&pki.other_ca), None, false);
        assert_refused(&o, &format!("TLS {} with the wrong CA", protocol.name()), "--otlp-ca FILE");
    }
    cleanup(&dir);
}

/// Flags that cannot work are refused at start, naming the flag and the file.
#[test]
fn tls_flags_are_checked_at_start() {
    let dir = temp_dir("otlp-tls-flags");
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "junk").unwrap();
    let base = |url: &str| ExportArgs { otlp: Some(url.into()), nvml_lib: Some("none".into()), ..ExportArgs::default() };
    let e =
        export::exporter_from_args(&ExportArgs { otlp_ca: Some(junk.clone()), ..base("https://127.0.0.1:4317") }, Arc::new(|_: &str| {}))
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap();
    assert!(e.contains("--otlp-ca") && e.contains("junk.pem"), "{e}");
    let e = export::otlp_config(&ExportArgs { otlp_ca: Some(junk.clone()), ..base("http://127.0.0.1:4317") }).unwrap_err().to_string();
    assert!(e.contains("https://"), "{e}");
    cleanup(&dir);
}
