//! The cluster's private PKI, generated in pure Rust (rcgen, ECDSA P-256).

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Errors generating certificates or keys.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters or failed to sign.
    #[error("generating {what}: {source}")]
    Rcgen {
        /// Which certificate or key.
        what: &'static str,
        /// The underlying error.
        source: rcgen::Error,
    },
}

fn rc(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError::Rcgen { what, source }
}

/// Everything the apiserver and its clients need, PEM encoded.
pub(crate) struct Pki {
    /// The CA that signed the serving certificate (clients trust it).
    pub ca_pem: String,
    /// The same CA, DER encoded.
    pub ca_der: Vec<u8>,
    /// kube-apiserver's serving certificate (127.0.0.1, the given addresses, localhost,
    /// kubernetes.default...).
    pub serving_cert_pem: String,
    /// Its private key.
    pub serving_key_pem: String,
    /// The key that signs service-account tokens (PKCS#8).
    pub service_account_key_pem: String,
    /// Its public half (PKIX), which verifies them: kube-apiserver reads public keys from
    /// `--service-account-key-file` and does not derive them from a PKCS#8 private key.
    pub service_account_pub_pem: String,
}

/// Generates the PKI; the serving certificate is valid for 127.0.0.1 and every address in `ips`
/// (the apiserver's bind address, the `kubernetes` Service's cluster IP).
pub(crate) fn generate(ips: &[IpAddr]) -> Result<Pki, CertError> {
    let ca_key = KeyPair::generate().map_err(rc("CA key"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(rc("CA parameters"))?;
    ca.distinguished_name
        .push(DnType::CommonName, "microvirt-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(rc("CA certificate"))?;
    let issuer = Issuer::from_params(&ca, &ca_key);

    let serving_key = KeyPair::generate().map_err(rc("serving key"))?;
    let names = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut serving =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .map_err(rc("serving parameters"))?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    for ip in ips {
        if !ip.is_loopback() {
            serving.subject_alt_names.push(SanType::IpAddress(*ip));
        }
    }
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving
        .signed_by(&serving_key, &issuer)
        .map_err(rc("serving certificate"))?;

    let sa_key = KeyPair::generate().map_err(rc("service-account key"))?;

    Ok(Pki {
        ca_pem: ca_cert.pem(),
        ca_der: ca_cert.der().to_vec(),
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        service_account_key_pem: sa_key.serialize_pem(),
        service_account_pub_pem: sa_key.public_key_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_pem_material() {
        let p = generate(&[IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1))]).unwrap();
        assert!(p.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(p
            .serving_cert_pem
            .starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(p.serving_key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(p.service_account_key_pem.contains("PRIVATE KEY"));
        assert!(p
            .service_account_pub_pem
            .starts_with("-----BEGIN PUBLIC KEY-----"));
        assert_ne!(p.serving_key_pem, p.service_account_key_pem);
        assert!(!p.ca_der.is_empty());
    }
}
