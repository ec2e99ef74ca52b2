//! Hand-written CPU kernels for the runner's hot path, over plain `&[f32]`:
//! [`matmul::matmul_xwt`] (GEMV for one row, register-tiled GEMM for batches, split over the
//! rayon pool) and the small element-wise ops ([`ops`]). Inputs are row-major; weights are
//! `[out, in]` so every output is a dot product of two contiguous rows.

mod huge_pages;
pub mod matmul;
pub mod ops;
mod out_ptr;
pub mod peak;
pub mod quant;
pub(crate) mod team;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vector_math;
pub mod width;

pub use matmul::{PackedMatrix, matmul_xwt};
pub use quant::{QFormat, QuantMatrix};

/// The kernel sets this process runs, for the start-up log and `/v1/models`:
/// `int8 avx512-vnni, f32 avx512` (choosing the int8 one if not yet chosen).
pub fn describe() -> String {
    format!(
        "int8 {}, f32 {}",
        quant::Isa::selected(),
        matmul::isa_name()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_description_names_the_chosen_kernels() {
        let d = super::describe();
        assert!(
            d.starts_with(&format!("int8 {}, f32 ", super::quant::Isa::selected())),
            "{d}"
        );
    }
}
