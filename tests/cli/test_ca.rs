//! Throwaway certificates for TLS tests, made with `openssl` (present on
//! these machines): a test CA, and a server certificate it signs.

use std::path::Path;
use std::process::Command;

/// Runs `openssl args` in `dir`; panics with its output on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA, `<name>.pem` with its key `<name>.key`, in `dir`.
pub fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

/// A server certificate `<name>.pem` with its key `<name>.key` (mode 0600,
/// as Postgres requires) in `dir`, for common name `cn` and the subject
/// alternative names `san` (such as `IP:127.0.0.1,DNS:localhost`), signed by
/// the CA `<ca>.pem` made by [`make_ca`] in the same directory.
pub fn make_server_cert(dir: &Path, ca: &str, name: &str, cn: &str, san: &str) {
    let csr = format!("{name}.csr");
    let key = format!("{name}.key");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
    );
    let ext = format!("{name}.ext.cnf");
    std::fs::write(dir.join(&ext), format!("subjectAltName={san}\n")).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &format!("{name}.pem"),
        ],
    );
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.join(key), std::fs::Permissions::from_mode(0o600)).unwrap();
}
