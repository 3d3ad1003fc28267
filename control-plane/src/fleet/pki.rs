//! The control plane's certificate authority. It signs the gRPC server
//! certificate and, at enrollment, one client certificate per device or
//! bridge. The identity goes into the certificate's common name as
//! `device/<id>` or `cluster/<id>`; the CSR's own subject is ignored, so a
//! caller cannot choose who it is.

use std::path::{Path, PathBuf};

use std::sync::{Arc, PoisonError, RwLock};

use anyhow::Context as _;
use edgeloop_models::fs::write_atomic;
use edgeloop_models::Digest;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use time::{Duration, OffsetDateTime};

use edgeloop_errors::Error;

/// A freshly signed client certificate.
#[derive(Debug, Clone)]
pub struct SignedCert {
    pub pem: String,
    /// sha256 of the DER; the control plane pins each member to this.
    pub fingerprint: Digest,
    pub not_after: OffsetDateTime,
}

pub struct Pki {
    ca_pem: String,
    ca_fingerprint: Digest,
    issuer: Issuer<'static, KeyPair>,
    /// When the CA stops being valid.
    ca_not_after: OffsetDateTime,
    /// The server certificate, which [`Pki::reissue_server_if_due`]
    /// replaces while the listeners run: they read it through
    /// [`Pki::server_resolver`] at each handshake.
    server: Arc<ServerCertSlot>,
    paths: Paths,
    server_names: Vec<String>,
}

/// The server certificate now: what a TLS handshake presents.
#[derive(Clone)]
struct ServerCert {
    /// Server certificate followed by the CA, so that a device holding only
    /// the CA fingerprint can find and check the CA during the handshake.
    chain_pem: String,
    not_after: OffsetDateTime,
    certified: Arc<rustls::sign::CertifiedKey>,
}

/// The current server certificate, swapped whole on reissue.
struct ServerCertSlot(RwLock<ServerCert>);

impl ServerCertSlot {
    fn get(&self) -> ServerCert {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl std::fmt::Debug for ServerCertSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCertSlot").finish_non_exhaustive()
    }
}

impl rustls::server::ResolvesServerCert for ServerCertSlot {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.get().certified)
    }
}

/// When the server certificate is reissued: within [`EXPIRY_WARNING`] of
/// its end, the same window `/readyz` warns in.
pub fn server_reissue_due(not_after: OffsetDateTime, now: OffsetDateTime) -> bool {
    validity(not_after, now) != Validity::Valid
}

/// How long a server certificate lasts (the most browsers accept).
const SERVER_LIFETIME: Duration = Duration::days(397);

/// How a certificate stands at some moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    Valid,
    /// Within [`EXPIRY_WARNING`] of its end: time to act.
    ExpiresSoon {
        days: i64,
    },
    Expired,
}

/// How long before a certificate's end it is reported as expiring.
pub const EXPIRY_WARNING: Duration = Duration::days(30);

/// Where `not_after` stands at `now`. Pure.
pub fn validity(not_after: OffsetDateTime, now: OffsetDateTime) -> Validity {
    if now >= not_after {
        Validity::Expired
    } else if not_after - now <= EXPIRY_WARNING {
        Validity::ExpiresSoon {
            days: (not_after - now).whole_days(),
        }
    } else {
        Validity::Valid
    }
}

/// The end of the first certificate in `pem`.
fn not_after_of(pem: &str) -> anyhow::Result<OffsetDateTime> {
    let der = pem_to_der(pem)?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(der.as_ref()).context("parsing the certificate")?;
    OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp())
        .context("the certificate's end")
}

#[derive(Debug, Clone)]
struct Paths {
    ca_cert: PathBuf,
    ca_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    server_names: PathBuf,
}

impl Paths {
    fn new(dir: &Path) -> Self {
        Self {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            server_names: dir.join("server.names"),
        }
    }
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive, non-zero, as RFC 5280 asks.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

fn pem_to_der(pem: &str) -> anyhow::Result<CertificateDer<'static>> {
    CertificateDer::from_pem_slice(pem.as_bytes()).context("parsing certificate PEM")
}

impl Pki {
    /// Loads the CA from `dir`, creating it on first start. The server
    /// certificate is reissued when the listen names change or it nears expiry.
    pub fn load_or_init(dir: &Path, server_names: &[String]) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let paths = Paths::new(dir);
        let now = OffsetDateTime::now_utc();

        let (ca_pem, ca_key) = if paths.ca_cert.exists() {
            let key_pem = std::fs::read_to_string(&paths.ca_key)
                .with_context(|| format!("reading {}", paths.ca_key.display()))?;
            let key = KeyPair::from_pem(&key_pem).context("parsing the CA key")?;
            let pem = std::fs::read_to_string(&paths.ca_cert)
                .with_context(|| format!("reading {}", paths.ca_cert.display()))?;
            (pem, key)
        } else {
            let key = KeyPair::generate().context("generating the CA key")?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            let mut dn = DistinguishedName::new();
            dn.push(
                DnType::CommonName,
                format!("Edgeloop CA {:08x}", rand::random::<u32>()),
            );
            dn.push(DnType::OrganizationName, "Edgeloop");
            params.distinguished_name = dn;
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            params.not_before = now - Duration::hours(1);
            params.not_after = now + Duration::days(3650);
            params.serial_number = Some(random_serial());
            let cert = params.self_signed(&key).context("self-signing the CA")?;
            // Key first: a crash between the two writes leaves a key without a
            // certificate, which the next start simply regenerates.
            write_atomic(&paths.ca_key, key.serialize_pem().as_bytes(), 0o600)?;
            write_atomic(&paths.ca_cert, cert.pem().as_bytes(), 0o644)?;
            (cert.pem(), key)
        };
        let ca_der = pem_to_der(&ca_pem)?;
        let ca_fingerprint = Digest::of(ca_der.as_ref());
        let issuer =
            Issuer::from_ca_cert_der(&ca_der, ca_key).context("loading the CA as issuer")?;

        let mut names: Vec<String> = server_names.to_vec();
        names.sort();
        names.dedup();
        let names_json = serde_json::to_string(&names)?;
        let reuse = std::fs::read_to_string(&paths.server_names).ok().as_deref()
            == Some(names_json.as_str())
            && server_cert_valid_for(&paths.server_cert, now + EXPIRY_WARNING);
        let server = if reuse {
            server_cert(
                std::fs::read_to_string(&paths.server_cert)?,
                std::fs::read_to_string(&paths.server_key)?,
            )?
        } else {
            issue_server(&paths, &names, &issuer, &ca_pem, now)?
        };
        write_atomic(&paths.server_names, names_json.as_bytes(), 0o644)?;
        let ca_not_after = not_after_of(&ca_pem).context("the CA certificate")?;
        Ok(Self {
            ca_pem,
            ca_fingerprint,
            issuer,
            ca_not_after,
            server: Arc::new(ServerCertSlot(RwLock::new(server))),
            paths,
            server_names: names,
        })
    }

    /// Reissues the server certificate if it ends within
    /// [`EXPIRY_WARNING`] of `now`, writing it to disk and swapping it in:
    /// the next handshake on every listener presents it, with no restart.
    /// Connections already open keep the one they started with. True if
    /// it was reissued.
    pub fn reissue_server_if_due(&self, now: OffsetDateTime) -> anyhow::Result<bool> {
        if !server_reissue_due(self.server_not_after(), now) {
            return Ok(false);
        }
        let fresh = issue_server(
            &self.paths,
            &self.server_names,
            &self.issuer,
            &self.ca_pem,
            now,
        )?;
        tracing::info!(not_after = %fresh.not_after, "server certificate reissued");
        *self
            .server
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(true)
    }

    /// What TLS listeners present: always the current server certificate.
    pub fn server_resolver(&self) -> Arc<dyn rustls::server::ResolvesServerCert> {
        self.server.clone()
    }

    /// When the CA stops being valid: then no member certificate verifies
    /// and nothing enrolls; a new PKI means every member enrolls again.
    pub fn ca_not_after(&self) -> OffsetDateTime {
        self.ca_not_after
    }

    /// When the current server certificate (reissued within 30 days of
    /// its end) stops being valid.
    pub fn server_not_after(&self) -> OffsetDateTime {
        self.server.get().not_after
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn ca_fingerprint(&self) -> Digest {
        self.ca_fingerprint
    }

    pub fn server_chain_pem(&self) -> String {
        self.server.get().chain_pem
    }

    /// Signs the public key in `csr_pem` as `identity` (e.g. `device/cam-01`).
    /// The CSR's signature is checked (proof the caller holds the key); its
    /// requested subject and extensions are ignored.
    pub fn sign_client(
        &self,
        csr_pem: &str,
        identity: &str,
        not_after: OffsetDateTime,
    ) -> Result<SignedCert, Error> {
        let csr = parse_csr(csr_pem)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, identity);
        dn.push(DnType::OrganizationName, "Edgeloop");
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = OffsetDateTime::now_utc() - Duration::minutes(5);
        params.not_after = not_after;
        params.serial_number = Some(random_serial());
        let cert = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|e| Error::bad_field("csr_pem", format!("cannot sign this CSR's key: {e}")))?;
        Ok(SignedCert {
            pem: cert.pem(),
            fingerprint: Digest::of(cert.der().as_ref()),
            not_after,
        })
    }
}

/// Signs a server certificate for `names` valid from now (the system's:
/// what peers check it against) until `now` + [`SERVER_LIFETIME`], and
/// writes it with its key. Key first: a crash between the writes leaves a
/// key without its certificate, and the start after reissues.
fn issue_server(
    paths: &Paths,
    names: &[String],
    issuer: &Issuer<'static, KeyPair>,
    ca_pem: &str,
    now: OffsetDateTime,
) -> anyhow::Result<ServerCert> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec()).context("server names")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "edgeloop control plane");
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.not_before = OffsetDateTime::now_utc().min(now) - Duration::hours(1);
    params.not_after = now + SERVER_LIFETIME;
    params.serial_number = Some(random_serial());
    let cert = params
        .signed_by(&key, issuer)
        .context("signing the server certificate")?;
    let chain = format!("{}{}", cert.pem(), ca_pem);
    write_atomic(&paths.server_key, key.serialize_pem().as_bytes(), 0o600)?;
    write_atomic(&paths.server_cert, chain.as_bytes(), 0o644)?;
    server_cert(chain, key.serialize_pem())
}

/// A server certificate chain and key, ready for handshakes.
fn server_cert(chain_pem: String, key_pem: String) -> anyhow::Result<ServerCert> {
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("reading the server certificate chain")?;
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("reading the server key")?;
    let certified =
        rustls::sign::CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
            .context("the server certificate and key")?;
    let not_after = not_after_of(&chain_pem).context("the server certificate")?;
    Ok(ServerCert {
        chain_pem,
        not_after,
        certified: Arc::new(certified),
    })
}

/// How often the server certificate's end is checked.
pub const REISSUE_CHECK: std::time::Duration = std::time::Duration::from_secs(3600);

/// Checks the server certificate at start and every [`REISSUE_CHECK`],
/// reissuing it within 30 days of its end (by the control plane's clock),
/// until `shutdown`. A failure is logged and tried again next time:
/// `/readyz` shows the end coming meanwhile.
pub async fn run_reissue(core: Arc<crate::Core>, shutdown: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(REISSUE_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let c = core.clone();
        match tokio::task::spawn_blocking(move || c.pki.reissue_server_if_due(c.now())).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %format!("{e:#}"), "reissuing the server certificate")
            }
            Err(e) => tracing::error!(error = %e, "server certificate task"),
        }
    }
}

/// A CSR off the wire: bounded, parsed, its self-signature checked.
fn parse_csr(csr_pem: &str) -> Result<CertificateSigningRequestParams, Error> {
    if csr_pem.len() > 16 * 1024 {
        return Err(Error::bad_field("csr_pem", "CSR is larger than 16 KiB"));
    }
    CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| {
        Error::bad_field(
            "csr_pem",
            format!("not a valid, self-signed PKCS#10 CSR: {e}"),
        )
    })
}

/// The sha256 of the public key a CSR asks a certificate for: what makes a
/// retried enrollment the same one.
pub fn csr_key(csr_pem: &str) -> Result<Digest, Error> {
    use rcgen::PublicKeyData as _;
    Ok(Digest::of(parse_csr(csr_pem)?.public_key.der_bytes()))
}

fn server_cert_valid_for(path: &Path, until: OffsetDateTime) -> bool {
    let Ok(pem) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(der) = pem_to_der(&pem) else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der.as_ref()) else {
        return false;
    };
    cert.validity().not_after.timestamp() > until.unix_timestamp()
}

/// The identity (`device/<id>`) in a client certificate's common name.
pub fn identity_of(cert_der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_certificate_is_valid_then_expiring_then_expired() {
        let end = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let table = [
            (end - Duration::days(31), Validity::Valid),
            (end - Duration::days(30), Validity::ExpiresSoon { days: 30 }),
            (end - Duration::hours(1), Validity::ExpiresSoon { days: 0 }),
            (end, Validity::Expired),
            (end + Duration::days(1), Validity::Expired),
        ];
        for (now, want) in table {
            assert_eq!(validity(end, now), want, "{now}");
        }
    }

    use super::*;

    #[test]
    fn the_server_certificate_is_reissued_within_30_days_of_its_end_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["localhost".to_string()];
        let pki = Pki::load_or_init(dir.path(), &names).unwrap();
        let first = pki.server_chain_pem();
        let end = pki.server_not_after();
        let now = OffsetDateTime::now_utc();
        assert!(!pki.reissue_server_if_due(now).unwrap());
        assert!(!pki.reissue_server_if_due(end - Duration::days(31)).unwrap());
        assert_eq!(pki.server_chain_pem(), first);
        let late = end - Duration::days(29);
        assert!(pki.reissue_server_if_due(late).unwrap());
        assert_ne!(pki.server_chain_pem(), first);
        // The certificate keeps whole seconds.
        assert!((pki.server_not_after() - (late + SERVER_LIFETIME)).abs() < Duration::seconds(1));
        // What a listener presents is the new one.
        let presented = pki.server.get().certified.cert[0].clone();
        assert_eq!(presented, pem_to_der(&pki.server_chain_pem()).unwrap());
        // On disk, so the next start keeps it.
        let again = Pki::load_or_init(dir.path(), &names).unwrap();
        assert_eq!(again.server_chain_pem(), pki.server_chain_pem());
        assert_eq!(again.ca_fingerprint(), pki.ca_fingerprint());
        for (not_after, now, due) in [
            (end, end - Duration::days(31), false),
            (end, end - Duration::days(30), true),
            (end, end, true),
        ] {
            assert_eq!(server_reissue_due(not_after, now), due, "{now}");
        }
    }

    #[test]
    fn init_reuse_and_sign() {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let pki = Pki::load_or_init(dir.path(), &names).unwrap();
        let again = Pki::load_or_init(dir.path(), &names).unwrap();
        assert_eq!(pki.ca_fingerprint(), again.ca_fingerprint());
        // The ends, read back from the certificates: the CA's ten years,
        // the server's 397 days.
        let now = OffsetDateTime::now_utc();
        let days = |t: OffsetDateTime| (t - now).whole_days();
        assert!((3648..=3650).contains(&days(again.ca_not_after())));
        assert!((395..=397).contains(&days(again.server_not_after())));
        assert_eq!(
            pki.server_chain_pem(),
            again.server_chain_pem(),
            "server cert reused"
        );
        let renamed = Pki::load_or_init(dir.path(), &["example.test".to_string()]).unwrap();
        assert_eq!(pki.ca_fingerprint(), renamed.ca_fingerprint());
        assert_ne!(
            pki.server_chain_pem(),
            renamed.server_chain_pem(),
            "server cert reissued"
        );

        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let key = KeyPair::generate().unwrap();
        let mut req = CertificateParams::default();
        req.distinguished_name
            .push(DnType::CommonName, "device/admin-please");
        let csr = req.serialize_request(&key).unwrap().pem().unwrap();
        let not_after = OffsetDateTime::now_utc() + Duration::days(1);
        let signed = pki.sign_client(&csr, "device/cam-01", not_after).unwrap();
        let der = pem_to_der(&signed.pem).unwrap();
        assert_eq!(identity_of(der.as_ref()).as_deref(), Some("device/cam-01"));
        assert_eq!(Digest::of(der.as_ref()), signed.fingerprint);

        for bad in [
            "",
            "garbage",
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
        ] {
            let err = pki.sign_client(bad, "device/x", not_after).unwrap_err();
            assert!(
                matches!(err, Error::BadRequest { field: Some(ref f), .. } if f == "csr_pem"),
                "{bad:?}"
            );
        }
    }
}
