//! Hand-written CPU kernels for the runner's hot path, over plain `&[f32]`:
//! [`matmul::matmul_xwt`] (GEMV for one row, register-tiled GEMM for batches, split over the
//! rayon pool) and the small element-wise ops ([`ops`]). Inputs are row-major; weights are
//! `[out, in]` so every output is a dot product of two contiguous rows.

pub mod matmul;
pub mod ops;
mod out_ptr;
pub mod peak;
pub mod quant;

pub use matmul::{PackedMatrix, matmul_xwt};
pub use quant::{QFormat, QuantMatrix};
