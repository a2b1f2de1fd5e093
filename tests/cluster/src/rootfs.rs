//! The filesystem of a minimal image for one of this project's binaries: the binary, the
//! shared libraries and loader it links against (from the machine's Debian packages, with
//! their copyright files), Debian's CA certificates, and a non-root user. No shell, no package
//! manager.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::image::{Entry, ImageSpec};
use crate::{Error, io_error};

/// The user every image runs as (the "nonroot" of distroless images).
pub const NONROOT_UID: u32 = 65532;
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

fn rootfs_error(what: impl Into<String>) -> Error {
    Error::Image(what.into())
}

/// Adds `binary` at `/usr/local/bin/<name>`, its libraries and loader, the CA bundle,
/// `/etc/passwd`, `/etc/group` and `/tmp`; sets the entrypoint, user and environment. Returns
/// the Debian packages the files came from (`name=version`), for a label.
pub fn add_binary(spec: &mut ImageSpec, binary: &Path, name: &str) -> Result<Vec<String>, Error> {
    let in_image = format!("/usr/local/bin/{name}");
    spec.add(
        &in_image,
        Entry::File {
            source: binary.to_path_buf(),
            mode: 0o755,
        },
    )?;
    let mut host_files = Vec::new();
    for (needed_at, real) in shared_libraries(binary)? {
        spec.add(
            &needed_at,
            Entry::File {
                source: real,
                mode: 0o755,
            },
        )?;
        // dpkg knows the path ldd names, not always the one it resolves to (merged /usr).
        host_files.push(PathBuf::from(needed_at));
    }
    if Path::new(CA_BUNDLE).is_file() {
        spec.add(
            CA_BUNDLE,
            Entry::File {
                source: CA_BUNDLE.into(),
                mode: 0o644,
            },
        )?;
        host_files.push(PathBuf::from("/usr/share/ca-certificates"));
    } else {
        return Err(rootfs_error(format!(
            "{CA_BUNDLE} is missing: install Debian's ca-certificates"
        )));
    }
    let passwd = format!(
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT_UID}:{NONROOT_UID}:nonroot:/home/nonroot:/sbin/nologin\n"
    );
    let group = format!("root:x:0:\nnonroot:x:{NONROOT_UID}:\n");
    spec.add(
        "/etc/passwd",
        Entry::Contents {
            bytes: passwd.into_bytes(),
            mode: 0o644,
        },
    )?;
    spec.add(
        "/etc/group",
        Entry::Contents {
            bytes: group.into_bytes(),
            mode: 0o644,
        },
    )?;
    spec.add("/tmp", Entry::Directory { mode: 0o1777 })?;
    spec.add("/home/nonroot", Entry::Directory { mode: 0o755 })?;

    let packages = debian_packages(&host_files)?;
    for package in &packages {
        let name = package.split('=').next().unwrap_or(package);
        // The package name without an architecture suffix names its doc directory.
        let doc_name = name.split(':').next().unwrap_or(name);
        let copyright = format!("/usr/share/doc/{doc_name}/copyright");
        if Path::new(&copyright).is_file() {
            spec.add(
                &copyright,
                Entry::File {
                    source: copyright.clone().into(),
                    mode: 0o644,
                },
            )?;
        }
    }

    spec.entrypoint = vec![in_image];
    spec.user = format!("{NONROOT_UID}:{NONROOT_UID}");
    spec.working_dir = "/".into();
    spec.env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".into(),
        format!("SSL_CERT_FILE={CA_BUNDLE}"),
    ];
    Ok(packages)
}

/// `(path the binary asks for, file on this machine)` of every shared library and the loader,
/// as `ldd` resolves them. A static binary needs none.
fn shared_libraries(binary: &Path) -> Result<Vec<(String, PathBuf)>, Error> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| io_error("running ldd", e))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        if text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&output.stderr).contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        return Err(rootfs_error(format!(
            "ldd {}: {}",
            binary.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    parse_ldd(&text)
        .into_iter()
        .map(|(needed_at, resolved)| {
            let real = std::fs::canonicalize(&resolved)
                .map_err(|e| io_error(format!("resolving {resolved}"), e))?;
            Ok((needed_at, real))
        })
        .collect()
}

/// From `ldd` output: libraries (`libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`) at the
/// path they resolved to, and the loader (`/lib64/ld-linux-x86-64.so.2 (0x…)`) at the path the
/// binary names. `linux-vdso` has no file.
pub(crate) fn parse_ldd(text: &str) -> Vec<(String, String)> {
    let mut found = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if let Some((_, right)) = line.split_once("=>") {
            if let Some(path) = right
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
            {
                found.insert((path.to_owned(), path.to_owned()));
            }
        } else if let Some(path) = line
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            found.insert((path.to_owned(), path.to_owned()));
        }
    }
    found.into_iter().collect()
}

/// `package=version` of the Debian packages that installed `files` (a directory counts for the
/// package that owns it).
fn debian_packages(files: &[PathBuf]) -> Result<Vec<String>, Error> {
    let mut names = BTreeSet::new();
    for file in files {
        let output = Command::new("dpkg-query")
            .arg("-S")
            .arg(file)
            .output()
            .map_err(|e| io_error("running dpkg-query", e))?;
        if !output.status.success() {
            return Err(rootfs_error(format!(
                "{} belongs to no Debian package; images take their libraries from Debian's",
                file.display()
            )));
        }
        // `libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6`, maybe several packages comma-separated.
        let text = String::from_utf8_lossy(&output.stdout);
        if let Some((packages, _)) = text.lines().next().and_then(|l| l.rsplit_once(": ")) {
            for package in packages.split(',').map(str::trim) {
                names.insert(package.to_owned());
            }
        }
    }
    let mut packages = Vec::new();
    for name in names {
        let output = Command::new("dpkg-query")
            .args(["-W", "-f=${Version}", &name])
            .output()
            .map_err(|e| io_error("running dpkg-query", e))?;
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        packages.push(format!("{name}={version}"));
    }
    Ok(packages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_names_libraries_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            [
                (
                    "/lib/x86_64-linux-gnu/libc.so.6".into(),
                    "/lib/x86_64-linux-gnu/libc.so.6".into()
                ),
                (
                    "/lib/x86_64-linux-gnu/libgcc_s.so.1".into(),
                    "/lib/x86_64-linux-gnu/libgcc_s.so.1".into()
                ),
                (
                    "/lib64/ld-linux-x86-64.so.2".into(),
                    "/lib64/ld-linux-x86-64.so.2".into()
                ),
            ]
        );
    }

    #[test]
    fn a_binary_of_this_machine_gets_its_libraries_from_debian() {
        // The test binary itself is a dynamically linked Rust program, like the images' ones.
        let binary = std::env::current_exe().expect("current exe");
        let mut spec = ImageSpec::default();
        let packages = add_binary(&mut spec, &binary, "tool").expect("rootfs");
        assert!(
            packages.iter().any(|p| p.starts_with("libc6")),
            "{packages:?}"
        );
        assert!(
            packages.iter().any(|p| p.starts_with("ca-certificates=")),
            "{packages:?}"
        );
        for path in [
            "/usr/local/bin/tool",
            "/lib64/ld-linux-x86-64.so.2",
            "/lib/x86_64-linux-gnu/libc.so.6",
            CA_BUNDLE,
            "/usr/share/doc/libc6/copyright",
        ] {
            assert!(
                spec.files.contains_key(path),
                "{path} in {:?}",
                spec.files.keys()
            );
        }
        assert_eq!(spec.user, "65532:65532");
        assert!(matches!(
            spec.files["/tmp"],
            Entry::Directory { mode: 0o1777 }
        ));
    }
}
