//! tidegate engine library.
