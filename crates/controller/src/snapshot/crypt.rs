//! Snapshots encrypted with a store's key, as they stream: ChaCha20-Poly1305 in the STREAM
//! construction (RustCrypto's `aead::stream`, big-endian 32-bit counter), 64 KiB chunks.
//!
//! The stored object is a header — [`MAGIC`] and the 7-byte nonce prefix, random per snapshot —
//! then each chunk sealed with its tag; the last chunk is sealed as the last, so a copy cut short
//! or reordered does not decrypt. The key is 32 bytes, base64 in the store's key Secret. We frame
//! the chunks ourselves because the crate gives the construction but not a stream adaptor; the
//! cryptography is all the crate's.
//!
//! A lost key is a lost snapshot: nothing, the operator included, reads it again.

use bytes::{Bytes, BytesMut};
use chacha20poly1305::aead::stream::{DecryptorBE32, EncryptorBE32};
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};

use super::copy::Hasher;

/// The manifest's name for this encryption.
pub const CIPHER: &str = "chacha20poly1305-stream-be32-64k";
/// The first bytes of an encrypted snapshot.
pub const MAGIC: &[u8; 8] = b"TPSNAPE1";
const NONCE_PREFIX: usize = 7;
const HEADER: usize = MAGIC.len() + NONCE_PREFIX;
/// Plaintext bytes per chunk.
const CHUNK: usize = 64 << 10;
const TAG: usize = 16;
/// The key Secret's key.
pub const KEY: &str = "key";

/// What goes wrong with a key or with the bytes it seals or opens.
#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    /// The key is not base64.
    #[error("the key is not base64 ({0}): make one with `head -c 32 /dev/urandom | base64`")]
    NotBase64(base64::DecodeError),
    /// The key is not 32 bytes: how many it is.
    #[error("the key is {0} bytes, not 32: make one with `head -c 32 /dev/urandom | base64`")]
    KeyLength(usize),
    /// The system gave no random bytes for a nonce.
    #[error("no random bytes for the nonce")]
    NoRandom,
    /// Encryption failed.
    #[error("encrypting the snapshot failed")]
    Seal,
    /// The stored bytes do not start with an encrypted snapshot's header.
    #[error("the stored snapshot is not encrypted (or not one of ours)")]
    NotEncrypted,
    /// The stored bytes end before the header does.
    #[error("the stored snapshot is cut short: no header")]
    NoHeader,
    /// The store's key does not open the bytes: another key sealed them, or they were changed or
    /// cut short.
    #[error(
        "the stored snapshot does not decrypt with the store's key: a different key encrypted it, or it was changed or cut short"
    )]
    WrongKey,
    /// The snapshot is encrypted but its store has no key now.
    #[error(
        "the snapshot is encrypted (key {key_id}) but its store has no key now: put that key back in the store's spec.encryption"
    )]
    NoKey {
        /// The id of the key that sealed it.
        key_id: String,
    },
    /// The snapshot was sealed with another key than the store's.
    #[error(
        "the snapshot was encrypted with key {key_id}, and the store's key now is {current}: put the old key back to read it"
    )]
    OtherKey {
        /// The id of the key that sealed it.
        key_id: String,
        /// The id of the store's key now.
        current: String,
    },
    /// The bytes being sealed or opened broke off: what their source said.
    #[error("{0}")]
    Input(String),
}

impl CryptError {
    /// A stable name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            CryptError::NotBase64(_) | CryptError::KeyLength(_) => "KeyInvalid",
            CryptError::NoRandom | CryptError::Seal => "EncryptFailed",
            CryptError::NotEncrypted | CryptError::NoHeader | CryptError::WrongKey => {
                "DecryptFailed"
            }
            CryptError::NoKey { .. } | CryptError::OtherKey { .. } => "KeyMissing",
            CryptError::Input(_) => "StreamBroken",
        }
    }
}

/// A store's snapshot key.
#[derive(Clone)]
pub struct SnapshotKey {
    key: chacha20poly1305::Key,
}

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SnapshotKey({})", self.id())
    }
}

impl SnapshotKey {
    /// From the Secret's text: 32 bytes in base64 (`head -c 32 /dev/urandom | base64`).
    pub fn from_base64(text: &str) -> Result<Self, CryptError> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(CryptError::NotBase64)?;
        let len = bytes.len();
        let array: [u8; 32] = bytes.try_into().map_err(|_| CryptError::KeyLength(len))?;
        Ok(Self {
            key: chacha20poly1305::Key::from(array),
        })
    }

    /// A short name for the key (the start of its SHA-256), kept in manifests so that a wrong
    /// key is named as such.
    pub fn id(&self) -> String {
        let mut h = Hasher::default();
        h.update(b"tenantplane snapshot key\0");
        h.update(&self.key);
        h.finish()[..16].to_string()
    }

    /// Encrypt `plain` as it streams.
    pub fn encrypt<S, E>(&self, plain: S) -> BoxStream<'static, Result<Bytes, CryptError>>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let mut prefix = [0u8; NONCE_PREFIX];
        let random = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut prefix);
        let cipher = ChaCha20Poly1305::new(&self.key);
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&prefix);
        let state = Crypt {
            input: plain
                .map(|r| r.map_err(|e| CryptError::Input(e.to_string())))
                .boxed(),
            buffer: BytesMut::new(),
            encryptor: Some(EncryptorBE32::from_aead(cipher, (&prefix).into())),
            first: Some(Bytes::from(header)),
            failed: random.err().map(|_| CryptError::NoRandom),
        };
        futures::stream::unfold(state, |mut s| async move {
            if let Some(e) = s.failed.take() {
                return Some((Err(e), s));
            }
            if let Some(h) = s.first.take() {
                return Some((Ok(h), s));
            }
            loop {
                let encryptor = s.encryptor.as_mut()?;
                if s.buffer.len() > CHUNK {
                    let chunk = s.buffer.split_to(CHUNK);
                    let sealed = encryptor
                        .encrypt_next(chunk.as_ref())
                        .map_err(|_| CryptError::Seal);
                    return Some((sealed.map(Bytes::from), s));
                }
                match s.input.next().await {
                    Some(Ok(bytes)) => s.buffer.extend_from_slice(&bytes),
                    Some(Err(e)) => {
                        s.encryptor = None;
                        return Some((Err(e), s));
                    }
                    None => {
                        let last = s.encryptor.take()?;
                        let rest = std::mem::take(&mut s.buffer);
                        let sealed = last
                            .encrypt_last(rest.as_ref())
                            .map_err(|_| CryptError::Seal);
                        return Some((sealed.map(Bytes::from), s));
                    }
                }
            }
        })
        .boxed()
    }

    /// Decrypt `sealed` as it streams; a wrong key, or a copy changed, cut short or reordered,
    /// fails with a message that says so.
    pub fn decrypt<S, E>(&self, sealed: S) -> BoxStream<'static, Result<Bytes, CryptError>>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let state = Open {
            input: sealed
                .map(|r| r.map_err(|e| CryptError::Input(e.to_string())))
                .boxed(),
            buffer: BytesMut::new(),
            key: self.key,
            decryptor: None,
            done: false,
        };
        futures::stream::unfold(state, |mut s| async move {
            if s.done {
                return None;
            }
            loop {
                if s.decryptor.is_none() && s.buffer.len() >= HEADER {
                    let header = s.buffer.split_to(HEADER);
                    if &header[..MAGIC.len()] != MAGIC {
                        s.done = true;
                        return Some((Err(CryptError::NotEncrypted), s));
                    }
                    let cipher = ChaCha20Poly1305::new(&s.key);
                    let prefix: [u8; NONCE_PREFIX] = header[MAGIC.len()..]
                        .try_into()
                        .unwrap_or([0; NONCE_PREFIX]);
                    s.decryptor = Some(DecryptorBE32::from_aead(cipher, (&prefix).into()));
                }
                if let Some(d) = s.decryptor.as_mut()
                    && s.buffer.len() > CHUNK + TAG
                {
                    let chunk = s.buffer.split_to(CHUNK + TAG);
                    return Some((opened(d.decrypt_next(chunk.as_ref()), &mut s.done), s));
                }
                match s.input.next().await {
                    Some(Ok(bytes)) => s.buffer.extend_from_slice(&bytes),
                    Some(Err(e)) => {
                        s.done = true;
                        return Some((Err(e), s));
                    }
                    None => {
                        s.done = true;
                        let Some(last) = s.decryptor.take() else {
                            return Some((Err(CryptError::NoHeader), s));
                        };
                        let rest = std::mem::take(&mut s.buffer);
                        let mut done = true;
                        return Some((opened(last.decrypt_last(rest.as_ref()), &mut done), s));
                    }
                }
            }
        })
        .boxed()
    }
}

fn opened(
    result: Result<Vec<u8>, chacha20poly1305::aead::Error>,
    done: &mut bool,
) -> Result<Bytes, CryptError> {
    result.map(Bytes::from).map_err(|_| {
        *done = true;
        CryptError::WrongKey
    })
}

struct Crypt {
    input: BoxStream<'static, Result<Bytes, CryptError>>,
    buffer: BytesMut,
    encryptor: Option<EncryptorBE32<ChaCha20Poly1305>>,
    first: Option<Bytes>,
    failed: Option<CryptError>,
}

struct Open {
    input: BoxStream<'static, Result<Bytes, CryptError>>,
    buffer: BytesMut,
    key: chacha20poly1305::Key,
    decryptor: Option<DecryptorBE32<ChaCha20Poly1305>>,
    done: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    fn key(byte: u8) -> SnapshotKey {
        use base64::Engine;
        SnapshotKey::from_base64(&base64::engine::general_purpose::STANDARD.encode([byte; 32]))
            .unwrap()
    }

    fn chunks(
        data: &[u8],
        size: usize,
    ) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static {
        let parts: Vec<Result<Bytes, std::convert::Infallible>> = data
            .chunks(size.max(1))
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(parts)
    }

    async fn collect(
        s: BoxStream<'static, Result<Bytes, CryptError>>,
    ) -> Result<Vec<u8>, CryptError> {
        let parts: Vec<Bytes> = s.try_collect().await?;
        Ok(parts.concat())
    }

    #[tokio::test]
    async fn what_is_encrypted_decrypts_whatever_the_sizes() {
        let k = key(7);
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 17] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let sealed = collect(k.encrypt(chunks(&data, 10_000))).await.unwrap();
            assert_eq!(&sealed[..8], MAGIC);
            assert_ne!(sealed[HEADER..].to_vec(), data, "{len}");
            // Read back in pieces of any size.
            for piece in [1usize, 4096, 70_000] {
                let opened = collect(k.decrypt(chunks(&sealed, piece))).await.unwrap();
                assert_eq!(opened, data, "len {len}, pieces of {piece}");
            }
        }
    }

    #[tokio::test]
    async fn a_wrong_key_a_change_or_a_cut_is_refused() {
        let data = vec![42u8; 2 * CHUNK + 5];
        let sealed = collect(key(1).encrypt(chunks(&data, 9000))).await.unwrap();
        let e = collect(key(2).decrypt(chunks(&sealed, 9000)))
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("does not decrypt with the store's key"),
            "{e}"
        );
        let mut changed = sealed.clone();
        let at = changed.len() / 2;
        changed[at] ^= 1;
        assert!(
            collect(key(1).decrypt(chunks(&changed, 9000)))
                .await
                .is_err()
        );
        // Cut at a chunk boundary: the last chunk read is not sealed as the last.
        let cut = sealed[..HEADER + CHUNK + TAG + 1].to_vec();
        assert!(collect(key(1).decrypt(chunks(&cut, 9000))).await.is_err());
        let e = collect(key(1).decrypt(chunks(&data, 9000)))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not encrypted"), "{e}");
    }

    #[test]
    fn keys_are_32_bytes_of_base64_and_named_by_a_digest() {
        assert!(
            SnapshotKey::from_base64("not base64!")
                .unwrap_err()
                .to_string()
                .contains("base64")
        );
        assert!(
            SnapshotKey::from_base64("AAAA")
                .unwrap_err()
                .to_string()
                .contains("not 32")
        );
        assert_eq!(key(1).id(), key(1).id());
        assert_ne!(key(1).id(), key(2).id());
        assert_eq!(key(1).id().len(), 16);
    }
}
