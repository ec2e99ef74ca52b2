//! How wide the float kernels may go: the f32 and bf16 matmul, the paged attention, the
//! activations' int8 quantization and SwiGLU each have an AVX-512, an AVX2 + FMA and a
//! portable form, and every one of them asks [`Width::selected`] which to run.
//!
//! The CPU decides, and `--cpu-kernels` may lower it ([`set_cap`], called with the int8 set's
//! cap): `--cpu-kernels avx2` on an AVX-512 server then runs every path an AVX2-only CPU
//! runs, not only its int8 kernels, so that machine's configuration can be measured and
//! tested on this one (the build's baseline is plain x86-64 either way: no code outside
//! these runtime-chosen paths uses wider instructions).
//!
//! Invariant: [`Width::selected`] never names a width the CPU lacks.

use std::sync::OnceLock;

use super::quant::Isa;

/// A vector width for the float kernels, widest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Width {
    /// AVX-512 F: 16 lanes.
    Avx512,
    /// AVX2 + FMA: 8 lanes.
    Avx2,
    /// Plain Rust, any CPU.
    Portable,
}

static CAP: OnceLock<Width> = OnceLock::new();

impl Width {
    /// The name `describe` prints for the f32 kernels (`matmul::isa_name`).
    pub fn name(self) -> &'static str {
        match self {
            Width::Avx512 => "avx512",
            Width::Avx2 => "avx2",
            Width::Portable => "portable",
        }
    }

    /// The widest the CPU has.
    pub fn detect() -> Width {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Width::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Width::Avx2;
            }
        }
        Width::Portable
    }

    /// The width the int8 set `isa` implies: what a CPU whose best int8 set is `isa` has
    /// (AVX-VNNI CPUs have no AVX-512).
    pub fn implied_by(isa: Isa) -> Width {
        match isa {
            Isa::Amx | Isa::Avx512Vnni => Width::Avx512,
            Isa::AvxVnni | Isa::Avx2 => Width::Avx2,
            Isa::Portable => Width::Portable,
        }
    }

    /// `detected`, lowered to `cap` where one is set.
    pub fn under(detected: Width, cap: Option<Width>) -> Width {
        cap.map_or(detected, |c| detected.max(c))
    }

    /// The width this process's float kernels run at.
    pub fn selected() -> Width {
        Width::under(Width::detect(), CAP.get().copied())
    }
}

/// Lowers the float kernels to what a CPU whose best int8 set is `isa` has (`--cpu-kernels`;
/// [`super::quant::set_cap`] calls it). A second call with another cap is refused.
pub(super) fn set_cap(isa: Isa) -> Result<(), String> {
    let cap = Width::implied_by(isa);
    if CAP.get() == Some(&cap) {
        return Ok(());
    }
    CAP.set(cap)
        .map_err(|_| "--cpu-kernels: the float kernels' width was already set".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_only_ever_lowers_the_width() {
        use Width::*;
        assert_eq!(Width::under(Avx512, Some(Avx2)), Avx2);
        assert_eq!(Width::under(Avx512, Some(Portable)), Portable);
        assert_eq!(Width::under(Avx2, Some(Avx512)), Avx2);
        assert_eq!(Width::under(Portable, Some(Avx2)), Portable);
        assert_eq!(Width::under(Avx2, None), Avx2);
    }

    #[test]
    fn each_int8_set_implies_the_width_its_cpus_have() {
        assert_eq!(Width::implied_by(Isa::Amx), Width::Avx512);
        assert_eq!(Width::implied_by(Isa::Avx512Vnni), Width::Avx512);
        assert_eq!(Width::implied_by(Isa::AvxVnni), Width::Avx2);
        assert_eq!(Width::implied_by(Isa::Avx2), Width::Avx2);
        assert_eq!(Width::implied_by(Isa::Portable), Width::Portable);
    }
}
