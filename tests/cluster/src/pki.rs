//! Throwaway key material, generated in-process for every cluster: a CA, a
//! serving certificate for 127.0.0.1/localhost, a service-account key and the
//! users' bearer tokens.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::Error;

pub(crate) struct Pki {
    pub ca_pem: String,
    /// A client certificate (CN `kube-apiserver-kubelet-client`, group `system:masters`) the
    /// API server shows the kubelet for logs and exec; only made for a node.
    pub kubelet_client: Option<(String, String)>,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    /// ECDSA P-256 private key in PKCS#8, for signing service-account tokens.
    pub service_account_key_pem: String,
    /// Its public key (SPKI), for verifying them. kube-apiserver's
    /// `--service-account-key-file` reads EC private keys only in SEC1 form,
    /// not PKCS#8, so the public key gets a file of its own.
    pub service_account_public_pem: String,
}

fn pki_error(e: rcgen::Error) -> Error {
    Error::Pki(e.to_string())
}

/// Key material for a cluster whose API server answers at 127.0.0.1/localhost and at
/// `extra_ips` and `extra_names` (a node's address and the `kubernetes` Service). With
/// `for_node`, also the API server's kubelet client certificate.
pub(crate) fn generate(
    extra_ips: &[&str],
    extra_names: &[&str],
    for_node: bool,
) -> Result<Pki, Error> {
    let ca_key = KeyPair::generate().map_err(pki_error)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(pki_error)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "backlog-operator local-cluster CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(pki_error)?;
    let issuer = Issuer::from_params(&ca_params, &ca_key);

    let serving_key = KeyPair::generate().map_err(pki_error)?;
    let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    names.extend(extra_ips.iter().chain(extra_names).map(|n| n.to_string()));
    let mut serving_params = CertificateParams::new(names).map_err(pki_error)?;
    serving_params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving_params
        .signed_by(&serving_key, &issuer)
        .map_err(pki_error)?;

    let service_account_key = KeyPair::generate().map_err(pki_error)?;

    let kubelet_client = if for_node {
        let key = KeyPair::generate().map_err(pki_error)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki_error)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver-kubelet-client");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).map_err(pki_error)?;
        Some((cert.pem(), key.serialize_pem()))
    } else {
        None
    };

    Ok(Pki {
        ca_pem: ca_cert.pem(),
        kubelet_client,
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        service_account_key_pem: service_account_key.serialize_pem(),
        service_account_public_pem: service_account_key.public_key_pem(),
    })
}

/// A random bearer token (128 bits, hex).
pub(crate) fn token() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::Pki(format!("no randomness: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_material_is_pem() {
        let pki = generate(&["10.96.0.1"], &["kubernetes.default.svc"], true).expect("generate");
        assert!(pki.kubelet_client.is_some());
        assert!(pki.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(
            pki.serving_cert_pem
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        assert!(
            pki.serving_key_pem
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
        assert!(
            pki.service_account_key_pem
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
        assert!(
            pki.service_account_public_pem
                .starts_with("-----BEGIN PUBLIC KEY-----")
        );
    }

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (token().expect("token"), token().expect("token"));
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
