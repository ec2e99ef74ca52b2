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
        let text = summarize(&crate::http::chain(&e));
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

/// An object store's error, on one short line: the HTTP status and the S3 error's code and
/// message when the answer carried them (`403 Forbidden: SignatureDoesNotMatch: The request
/// signature …`), else the error's first line; never the whole XML body, repeated.
pub fn summarize(text: &str) -> String {
    let between = |open: &str, close: &str| {
        let start = text.find(open)? + open.len();
        let len = text[start..].find(close)?;
        Some(text[start..start + len].trim().to_string())
    };
    let status = between("status code: ", ":").or_else(|| between("status code: ", "\n"));
    let code = between("<Code>", "</Code>");
    let message = between("<Message>", "</Message>");
    let line = match (status, code, message) {
        (Some(s), Some(c), Some(m)) => format!("{s}: {c}: {m}"),
        (None, Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(s), _, _) => format!("{s}: {}", first_line(text)),
        _ => first_line(text),
    };
    line.chars().take(400).collect()
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_s3_refusal_is_its_status_code_and_message_on_one_line() {
        let raw = "Generic S3 error: Error performing list request: Error performing GET http://s3/models?list-type=2 in 4ms - Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?>\n<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match.</Message></Error>: Error performing list request: again";
        assert_eq!(
            summarize(raw),
            "403 Forbidden: SignatureDoesNotMatch: The request signature we calculated does not match."
        );
        assert_eq!(
            summarize("Object at location x not found\nmore"),
            "Object at location x not found"
        );
    }
}
