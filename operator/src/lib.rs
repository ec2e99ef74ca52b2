//! tidegate operator library.
