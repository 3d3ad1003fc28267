//! The control plane's certificate authority. It signs the gRPC server
//! certificate and, at enrollment, one client certificate per device or
//! bridge. The identity goes into the certificate's common name as
//! `device/<id>` or `cluster/<id>`; the CSR's own subject is ignored, so a
//! caller cannot choose who it is.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use edgeloop_models::fs::write_atomic;
use edgeloop_models::Digest;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use time::{Duration, OffsetDateTime};

use crate::error::Error;

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
    /// Server certificate followed by the CA, so that a device holding only
    /// the CA fingerprint can find and check the CA during the handshake.
    server_chain_pem: String,
    server_key_pem: String,
    /// When the CA and the server certificate stop being valid.
    ca_not_after: OffsetDateTime,
    server_not_after: OffsetDateTime,
}

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
            && server_cert_valid_for(&paths.server_cert, now + Duration::days(30));
        let (server_chain_pem, server_key_pem) = if reuse {
            (
                std::fs::read_to_string(&paths.server_cert)?,
                std::fs::read_to_string(&paths.server_key)?,
            )
        } else {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(names.clone()).context("server names")?;
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, "edgeloop control plane");
            params.distinguished_name = dn;
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.not_before = now - Duration::hours(1);
            params.not_after = now + Duration::days(397);
            params.serial_number = Some(random_serial());
            let cert = params
                .signed_by(&key, &issuer)
                .context("signing the server certificate")?;
            let chain = format!("{}{}", cert.pem(), ca_pem);
            write_atomic(&paths.server_key, key.serialize_pem().as_bytes(), 0o600)?;
            write_atomic(&paths.server_cert, chain.as_bytes(), 0o644)?;
            write_atomic(&paths.server_names, names_json.as_bytes(), 0o644)?;
            (chain, key.serialize_pem())
        };
        let ca_not_after = not_after_of(&ca_pem).context("the CA certificate")?;
        let server_not_after = not_after_of(&server_chain_pem).context("the server certificate")?;
        Ok(Self {
            ca_pem,
            ca_fingerprint,
            issuer,
            server_chain_pem,
            server_key_pem,
            ca_not_after,
            server_not_after,
        })
    }

    /// When the CA stops being valid: then no member certificate verifies
    /// and nothing enrolls; a new PKI means every member enrolls again.
    pub fn ca_not_after(&self) -> OffsetDateTime {
        self.ca_not_after
    }

    /// When the server certificate (reissued at start within 30 days of its
    /// end) stops being valid.
    pub fn server_not_after(&self) -> OffsetDateTime {
        self.server_not_after
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn ca_fingerprint(&self) -> Digest {
        self.ca_fingerprint
    }

    pub fn server_chain_pem(&self) -> &str {
        &self.server_chain_pem
    }

    pub fn server_key_pem(&self) -> &str {
        &self.server_key_pem
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
