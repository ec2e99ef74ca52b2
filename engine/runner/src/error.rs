//! The engine crate's error type. Every fallible path in model loading, tokenization and the
//! runner returns [`Error`]; nothing in these paths unwraps. [`Error::metric_label`] gives a
//! short, stable, low-cardinality label for metrics (never includes paths or messages).

use std::path::PathBuf;

/// Result alias used across the engine crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a file failed.
    #[error("i/o error on {path}: {source}")]
    Io {
        /// The file that was being read or written.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The model files are not in a layout or format this engine understands.
    #[error("unsupported model: {0}")]
    UnsupportedModel(String),
    /// A configuration value is missing or malformed.
    #[error("bad model config: {0}")]
    Config(String),
    /// A weight is missing or has the wrong shape.
    #[error("bad weight {name}: {reason}")]
    Weight {
        /// Checkpoint key (Hugging Face naming).
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The tokenizer could not be built or failed on an input.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A tensor operation failed inside candle.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// The device or runner asked for cannot run here (wrong pairing, a build without the
    /// feature, a GPU that cannot be opened).
    #[error("{0}")]
    Placement(String),
    /// The caller passed an invalid batch (token out of range, block table too short, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

impl Error {
    /// A short label suitable for a Prometheus label value.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::UnsupportedModel(_) => "unsupported_model",
            Error::Config(_) => "config",
            Error::Weight { .. } => "weight",
            Error::Tokenizer(_) => "tokenizer",
            Error::Candle(_) => "tensor",
            Error::InvalidInput(_) => "invalid_input",
            Error::Placement(_) => "placement",
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn weight(name: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Weight {
            name: name.into(),
            reason: reason.into(),
        }
    }
}
