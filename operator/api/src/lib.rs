//! tidegate.dev/v1alpha1 API types.
pub mod duration;
