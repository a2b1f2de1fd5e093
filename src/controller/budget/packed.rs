//! A value kept for a long time as its JSON, LZ4-compressed against a dictionary of what
//! every such value spells alike (field names, the usual wording). The operator keeps one
//! status and one spec per budget for as long as it runs; as Rust values each is a few
//! kilobytes of fields and small strings, packed each is a few hundred bytes. A poll unpacks
//! its own budget's values, which costs microseconds.
//!
//! What is packed reads back exactly: numbers are written and read exactly (`serde_json`'s
//! `float_roundtrip`), so only what the JSON form itself keeps less of (such as a `Time`'s
//! whole seconds) differs.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A kind of value that is packed, with the dictionary its values are packed against.
pub trait Packable: Serialize + DeserializeOwned {
    /// A typical value's JSON as this type writes it. Only the size of what is packed depends
    /// on it: any value packs and unpacks whole whatever the dictionary says.
    fn dictionary() -> &'static [u8];
}

/// A packed `T`. Cloning shares it.
pub struct Packed<T> {
    bytes: Arc<[u8]>,
    packs: PhantomData<fn() -> T>,
}

/// Why a packed value could not be read back: never expected, since only [`Packed::pack`]
/// makes one; callers start afresh or report it.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("the packed value does not decompress: {0}")]
    Decompress(#[from] lz4_flex::block::DecompressError),
    #[error("the packed value does not read as what was packed: {0}")]
    Json(#[from] serde_json::Error),
}

impl<T: Packable> Packed<T> {
    pub fn pack(value: &T) -> Packed<T> {
        // The API types always serialize (no maps with non-string keys); were one ever not
        // to, it would pack as nothing and unpacking would say so.
        let json = serde_json::to_vec(value).unwrap_or_default();
        Packed {
            bytes: lz4_flex::block::compress_prepend_size_with_dict(&json, T::dictionary()).into(),
            packs: PhantomData,
        }
    }

    pub fn unpack(&self) -> Result<T, UnpackError> {
        let json =
            lz4_flex::block::decompress_size_prepended_with_dict(&self.bytes, T::dictionary())?;
        Ok(serde_json::from_slice(&json)?)
    }

    /// The bytes the packed value takes.
    #[cfg(test)]
    pub fn packed_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The same value with its bytes damaged, for tests of the error path.
    #[cfg(test)]
    pub fn truncated(&self) -> Packed<T> {
        Packed {
            bytes: self.bytes[..self.bytes.len() / 2].into(),
            packs: PhantomData,
        }
    }
}

/// The dictionary for a type whose typical value is `sample` (JSON or YAML of a `T`): the
/// bytes `T` would write for it, so its field order and spelling are the packed ones whatever
/// the sample's layout.
pub fn dictionary_from<T: Packable>(sample: &str) -> Vec<u8> {
    serde_yaml::from_str::<T>(sample)
        .ok()
        .and_then(|value| serde_json::to_vec(&value).ok())
        .unwrap_or_else(|| sample.as_bytes().to_vec())
}

impl<T> Clone for Packed<T> {
    fn clone(&self) -> Self {
        Packed {
            bytes: Arc::clone(&self.bytes),
            packs: PhantomData,
        }
    }
}

impl<T> PartialEq for Packed<T> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl<T: Packable + std::fmt::Debug> std::fmt::Debug for Packed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.unpack() {
            Ok(value) => value.fmt(f),
            Err(error) => write!(f, "Packed({error})"),
        }
    }
}
