//! Why a fetch failed, in words a pool's status can carry: the URI, then the cause
//! (a missing object, refused credentials, a checksum that does not match, a store that
//! cannot be reached), one line.

/// A failed fetch of `uri`.
#[derive(Debug, thiserror::Error)]
#[error("{uri}: {cause}")]
pub struct FetchError {
    pub uri: String,
    pub cause: Cause,
}

/// The cause of a failed fetch.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("credentials refused: {0}")]
    Denied(String),
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("verification failed: {0}")]
    Corrupt(String),
    #[error("not in the Hugging Face cache, and the hub is not asked ({0})")]
    NotCached(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Other(String),
}

impl Cause {
    /// The cause of an object-store error, by its kind (object_store maps HTTP 404 to
    /// NotFound and 401/403 to Unauthenticated/PermissionDenied).
    pub fn from_store(e: object_store::Error) -> Self {
        use object_store::Error as E;
        let text = crate::http::chain(&e);
        match e {
            E::NotFound { .. } => Cause::NotFound(text),
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => Cause::Denied(text),
            _ if text.contains("InvalidAccessKeyId")
                || text.contains("SignatureDoesNotMatch")
                || text.contains("AccessDenied") =>
            {
                Cause::Denied(text)
            }
            _ if text.contains("error trying to connect") || text.contains("Connect") => {
                Cause::Unreachable(text)
            }
            _ => Cause::Other(text),
        }
    }

    pub fn io(what: &std::path::Path, e: std::io::Error) -> Self {
        Cause::Io(format!("{}: {e}", what.display()))
    }
}
