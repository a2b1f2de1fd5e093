//! OCI image archives without a container engine: one uncompressed layer built from a list of
//! files, its config, manifest and index written with the `oci-spec` types, all packed into an
//! OCI image-layout tar that `ctr images import`, `skopeo copy oci-archive:` and `crane push`
//! read.
//!
//! Reproducible: entries are sorted, owners are 0:0, every mtime is the image's `created` time
//! (or the epoch), JSON objects are written with sorted keys, so the same files and settings
//! give the same digest byte for byte.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use oci_spec::image::{
    Arch, ConfigBuilder, DescriptorBuilder, ImageConfigurationBuilder, ImageIndexBuilder,
    ImageManifestBuilder, MediaType, Os, PlatformBuilder, RootFsBuilder, Sha256Digest,
};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::{Error, io_error};

/// The annotation containerd names an imported image by.
pub const CONTAINERD_NAME_ANNOTATION: &str = "io.containerd.image.name";

/// One file of the image's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A regular file copied from the host, with its mode.
    File {
        source: PathBuf,
        mode: u32,
    },
    /// A regular file with the given contents.
    Contents {
        bytes: Vec<u8>,
        mode: u32,
    },
    Directory {
        mode: u32,
    },
    Symlink {
        target: String,
    },
}

/// What the image is: its name, its files (absolute paths inside the image) and its config.
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    /// Full reference, e.g. `localhost/backlog-operator:0.1.0`.
    pub name: String,
    pub files: BTreeMap<String, Entry>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    /// `uid:gid`
    pub user: String,
    pub working_dir: String,
    /// `8080/tcp`
    pub exposed_ports: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Seconds since the epoch: the `created` time and every file's mtime. `None`: no
    /// `created`, mtimes 0.
    pub created: Option<i64>,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    pub name: String,
    /// `sha256:…` of the manifest: the image's identity in any registry or runtime.
    pub manifest_digest: String,
    /// `sha256:…` of the config (the "image id" of `ctr`/`crictl`).
    pub config_digest: String,
    /// Bytes of the archive.
    pub archive_size: u64,
}

fn image_error(what: impl Into<String>) -> Error {
    Error::Image(what.into())
}

impl ImageSpec {
    /// Adds `path` and every missing parent directory (mode 0755).
    pub fn add(&mut self, path: &str, entry: Entry) -> Result<(), Error> {
        let path = normalize(path)?;
        let mut parent = Path::new(&path).parent();
        while let Some(dir) = parent {
            let dir_str = dir.to_string_lossy().into_owned();
            if dir_str == "/" || dir_str.is_empty() {
                break;
            }
            self.files
                .entry(dir_str)
                .or_insert(Entry::Directory { mode: 0o755 });
            parent = dir.parent();
        }
        self.files.insert(path, entry);
        Ok(())
    }
}

/// `/a/b` for `a/b`, `/a/b/`, `/a/./b`; refuses `..`.
fn normalize(path: &str) -> Result<String, Error> {
    let mut parts = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(image_error(format!("image path {path:?} leaves the root")));
            }
        }
    }
    if parts.is_empty() {
        return Err(image_error(format!("image path {path:?} names the root")));
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Writes the OCI image-layout archive of `spec` to `out` (through a temporary file, so a
/// reader never sees half an archive) and returns its digests.
pub fn write_archive(spec: &ImageSpec, out: &Path) -> Result<BuiltImage, Error> {
    let mtime = spec.created.unwrap_or(0).max(0) as u64;
    let layer = layer_tar(spec, mtime)?;
    let layer_digest = sha256_hex(&layer);

    let mut config = ConfigBuilder::default()
        .entrypoint(spec.entrypoint.clone())
        .env(spec.env.clone())
        .user(spec.user.clone())
        .working_dir(spec.working_dir.clone())
        .labels(
            spec.labels
                .clone()
                .into_iter()
                .collect::<std::collections::HashMap<_, _>>(),
        );
    if !spec.cmd.is_empty() {
        config = config.cmd(spec.cmd.clone());
    }
    if !spec.exposed_ports.is_empty() {
        config = config.exposed_ports(spec.exposed_ports.clone());
    }
    let config = config
        .build()
        .map_err(|e| image_error(format!("image config: {e}")))?;
    let rootfs = RootFsBuilder::default()
        .typ("layers")
        .diff_ids(vec![format!("sha256:{layer_digest}")])
        .build()
        .map_err(|e| image_error(format!("rootfs: {e}")))?;
    let mut configuration = ImageConfigurationBuilder::default()
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(config)
        .rootfs(rootfs);
    if let Some(created) = spec.created {
        configuration = configuration.created(rfc3339(created));
    }
    let configuration = configuration
        .build()
        .map_err(|e| image_error(format!("image configuration: {e}")))?;
    let config_json = canonical_json(&configuration)?;
    let config_digest = sha256_hex(&config_json);

    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(
            MediaType::ImageConfig,
            &config_digest,
            config_json.len(),
        )?)
        .layers(vec![descriptor(
            MediaType::ImageLayer,
            &layer_digest,
            layer.len(),
        )?])
        .annotations(
            [
                annotation_pair("org.opencontainers.image.title", spec),
                annotation_pair("org.opencontainers.image.version", spec),
            ]
            .into_iter()
            .flatten()
            .collect::<std::collections::HashMap<_, _>>(),
        )
        .build()
        .map_err(|e| image_error(format!("manifest: {e}")))?;
    let manifest_json = canonical_json(&manifest)?;
    let manifest_digest = sha256_hex(&manifest_json);

    let tag = spec
        .name
        .rsplit_once(':')
        .filter(|(_, tag)| !tag.contains('/'))
        .map(|(_, tag)| tag.to_owned())
        .ok_or_else(|| image_error(format!("image name {:?} has no tag", spec.name)))?;
    let mut index_descriptor = descriptor(
        MediaType::ImageManifest,
        &manifest_digest,
        manifest_json.len(),
    )?;
    index_descriptor.set_platform(Some(
        PlatformBuilder::default()
            .architecture(Arch::Amd64)
            .os(Os::Linux)
            .build()
            .map_err(|e| image_error(format!("platform: {e}")))?,
    ));
    index_descriptor.set_annotations(Some(
        [
            (CONTAINERD_NAME_ANNOTATION.to_owned(), spec.name.clone()),
            ("org.opencontainers.image.ref.name".to_owned(), tag),
        ]
        .into_iter()
        .collect(),
    ));
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![index_descriptor])
        .build()
        .map_err(|e| image_error(format!("index: {e}")))?;
    let index_json = canonical_json(&index)?;

    let mut archive = TarWriter::new(mtime);
    archive.directory("blobs", 0o755)?;
    archive.directory("blobs/sha256", 0o755)?;
    // Sorted by name, as every other list in the archive.
    let mut blobs = [
        (config_digest.clone(), config_json),
        (layer_digest, layer),
        (manifest_digest.clone(), manifest_json),
    ];
    blobs.sort_by(|a, b| a.0.cmp(&b.0));
    for (digest, bytes) in &blobs {
        archive.file(&format!("blobs/sha256/{digest}"), bytes, 0o644)?;
    }
    archive.file("index.json", &index_json, 0o644)?;
    archive.file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644)?;
    let bytes = archive.finish()?;

    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| io_error(format!("creating {}", dir.display()), e))?;
    }
    let temporary = out.with_extension("tar.partial");
    {
        let file = File::create(&temporary)
            .map_err(|e| io_error(format!("creating {}", temporary.display()), e))?;
        let mut writer = BufWriter::new(file);
        writer
            .write_all(&bytes)
            .and_then(|()| writer.flush())
            .map_err(|e| io_error(format!("writing {}", temporary.display()), e))?;
    }
    fs::rename(&temporary, out)
        .map_err(|e| io_error(format!("moving the archive to {}", out.display()), e))?;
    Ok(BuiltImage {
        name: spec.name.clone(),
        manifest_digest: format!("sha256:{manifest_digest}"),
        config_digest: format!("sha256:{config_digest}"),
        archive_size: bytes.len() as u64,
    })
}

fn annotation_pair(key: &str, spec: &ImageSpec) -> Option<(String, String)> {
    spec.labels
        .get(key)
        .map(|value| (key.to_owned(), value.clone()))
}

fn descriptor(
    media_type: MediaType,
    hex: &str,
    size: usize,
) -> Result<oci_spec::image::Descriptor, Error> {
    let digest = Sha256Digest::from_str(hex).map_err(|e| image_error(format!("digest: {e}")))?;
    DescriptorBuilder::default()
        .media_type(media_type)
        .digest(digest)
        .size(size as u64)
        .build()
        .map_err(|e| image_error(format!("descriptor: {e}")))
}

/// The layer: every entry of `spec.files` in path order, owned by 0:0, at `mtime`.
fn layer_tar(spec: &ImageSpec, mtime: u64) -> Result<Vec<u8>, Error> {
    let mut tar = TarWriter::new(mtime);
    for (path, entry) in &spec.files {
        let name = path.trim_start_matches('/');
        match entry {
            Entry::Directory { mode } => tar.directory(name, *mode)?,
            Entry::Contents { bytes, mode } => tar.file(name, bytes, *mode)?,
            Entry::File { source, mode } => {
                let mut bytes = Vec::new();
                File::open(source)
                    .and_then(|mut f| f.read_to_end(&mut bytes))
                    .map_err(|e| io_error(format!("reading {}", source.display()), e))?;
                tar.file(name, &bytes, *mode)?;
            }
            Entry::Symlink { target } => tar.symlink(name, target)?,
        }
    }
    tar.finish()
}

/// A tar stream whose headers depend only on name, mode, size and the one mtime.
struct TarWriter {
    builder: tar::Builder<Vec<u8>>,
    mtime: u64,
}

impl TarWriter {
    fn new(mtime: u64) -> Self {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        TarWriter { builder, mtime }
    }

    fn header(&self, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_mtime(self.mtime);
        header.set_uid(0);
        header.set_gid(0);
        header
    }

    fn directory(&mut self, name: &str, mode: u32) -> Result<(), Error> {
        let mut header = self.header(tar::EntryType::Directory, mode, 0);
        self.builder
            .append_data(&mut header, format!("{name}/"), io::empty())
            .map_err(|e| io_error(format!("adding directory {name}"), e))
    }

    fn file(&mut self, name: &str, bytes: &[u8], mode: u32) -> Result<(), Error> {
        let mut header = self.header(tar::EntryType::Regular, mode, bytes.len() as u64);
        self.builder
            .append_data(&mut header, name, bytes)
            .map_err(|e| io_error(format!("adding {name}"), e))
    }

    fn symlink(&mut self, name: &str, target: &str) -> Result<(), Error> {
        let mut header = self.header(tar::EntryType::Symlink, 0o777, 0);
        self.builder
            .append_link(&mut header, name, target)
            .map_err(|e| io_error(format!("adding link {name}"), e))
    }

    fn finish(self) -> Result<Vec<u8>, Error> {
        self.builder
            .into_inner()
            .map_err(|e| io_error("finishing a tar stream", e))
    }
}

/// JSON with object keys sorted at every level: `oci-spec` keeps labels and annotations in
/// hash maps, whose order changes from run to run.
fn canonical_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Error> {
    let value = serde_json::to_value(value).map_err(|e| image_error(e.to_string()))?;
    serde_json::to_vec(&sorted(value)).map_err(|e| image_error(e.to_string()))
}

fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (proleptic Gregorian, UTC).
pub fn rfc3339(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path) -> ImageSpec {
        let binary = dir.join("tool");
        fs::write(&binary, b"#!/bin/true\n").expect("write");
        let mut spec = ImageSpec {
            name: "localhost/tool:1.2.3".into(),
            entrypoint: vec!["/usr/local/bin/tool".into()],
            user: "65532:65532".into(),
            working_dir: "/".into(),
            created: Some(1_700_000_000),
            ..ImageSpec::default()
        };
        for (key, value) in [
            ("org.opencontainers.image.title", "tool"),
            ("org.opencontainers.image.version", "1.2.3"),
            ("org.opencontainers.image.licenses", "Apache-2.0"),
            ("org.opencontainers.image.revision", "abc"),
        ] {
            spec.labels.insert(key.into(), value.into());
        }
        spec.add(
            "/usr/local/bin/tool",
            Entry::File {
                source: binary,
                mode: 0o755,
            },
        )
        .expect("add");
        spec.add(
            "/etc/passwd",
            Entry::Contents {
                bytes: b"nonroot:x:65532:65532::/:/sbin/nologin\n".to_vec(),
                mode: 0o644,
            },
        )
        .expect("add");
        spec
    }

    #[test]
    fn the_same_input_gives_the_same_digest() {
        let dir = tempfile::tempdir().expect("temp dir");
        let spec = spec(dir.path());
        let first = write_archive(&spec, &dir.path().join("a.tar")).expect("first");
        let second = write_archive(&spec, &dir.path().join("b.tar")).expect("second");
        assert_eq!(first, second);
        assert_eq!(
            fs::read(dir.path().join("a.tar")).expect("a"),
            fs::read(dir.path().join("b.tar")).expect("b"),
            "byte-identical archives"
        );
    }

    #[test]
    fn any_change_of_input_changes_the_digest() {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = spec(dir.path());
        let digest = |spec: &ImageSpec, name: &str| {
            write_archive(spec, &dir.path().join(name))
                .expect("archive")
                .manifest_digest
        };
        let original = digest(&base, "base.tar");
        let mut label = base.clone();
        label
            .labels
            .insert("org.opencontainers.image.revision".into(), "def".into());
        let mut time = base.clone();
        time.created = Some(1_700_000_001);
        let mut file = base.clone();
        file.add(
            "/etc/group",
            Entry::Contents {
                bytes: b"nonroot:x:65532:\n".to_vec(),
                mode: 0o644,
            },
        )
        .expect("add");
        for (changed, name) in [(&label, "label"), (&time, "time"), (&file, "file")] {
            assert_ne!(digest(changed, name), original, "{name}");
        }
    }

    #[test]
    fn the_archive_is_an_oci_layout_naming_the_image() {
        let dir = tempfile::tempdir().expect("temp dir");
        let built = write_archive(&spec(dir.path()), &dir.path().join("x.tar")).expect("build");
        let mut archive = tar::Archive::new(File::open(dir.path().join("x.tar")).expect("open"));
        let mut names = Vec::new();
        let mut index = String::new();
        let mut blobs = BTreeMap::new();
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let name = entry.path().expect("path").to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).expect("read");
            if name == "index.json" {
                index = String::from_utf8(bytes.clone()).expect("utf-8");
            }
            if let Some(digest) = name.strip_prefix("blobs/sha256/").filter(|d| !d.is_empty()) {
                assert_eq!(sha256_hex(&bytes), digest, "blob content matches its name");
                blobs.insert(digest.to_owned(), bytes);
            }
            names.push(name);
        }
        assert!(names.contains(&"oci-layout".to_owned()), "{names:?}");
        let index: Value = serde_json::from_str(&index).expect("index json");
        let manifest = &index["manifests"][0];
        assert_eq!(
            manifest["annotations"][CONTAINERD_NAME_ANNOTATION],
            "localhost/tool:1.2.3"
        );
        assert_eq!(
            format!(
                "sha256:{}",
                manifest["digest"]
                    .as_str()
                    .expect("digest")
                    .trim_start_matches("sha256:")
            ),
            built.manifest_digest
        );
        let config_hex = built.config_digest.trim_start_matches("sha256:");
        let config: Value = serde_json::from_slice(&blobs[config_hex]).expect("config json");
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.licenses"],
            "Apache-2.0"
        );
        assert_eq!(config["created"], "2023-11-14T22:13:20Z");
        assert_eq!(config["os"], "linux");
    }

    #[test]
    fn paths_are_normalized_and_parents_added() {
        let mut spec = ImageSpec::default();
        spec.add(
            "etc/ssl/certs/ca.crt",
            Entry::Contents {
                bytes: vec![],
                mode: 0o644,
            },
        )
        .expect("add");
        let paths: Vec<&str> = spec.files.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "/etc",
                "/etc/ssl",
                "/etc/ssl/certs",
                "/etc/ssl/certs/ca.crt"
            ]
        );
        assert!(
            spec.add("/../etc/x", Entry::Directory { mode: 0o755 })
                .is_err()
        );
    }

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
